"""One artifact's whole path without Prefect: intake → build → run → compare → gate → record.

Each step is a plain function so the Prefect flows (flows/) can wrap them as
tasks, and the CLI can call them in-process. Running and comparing stay apart:
every run writes a result folder under the runs folder, and the decision is
computed from saved folders only.

An unchanged input (same artifact, device class, image id and data) reuses its
saved result instead of starting a container: the run folder is named by a
hash of those four.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tiergate import results
from tiergate.artifact import Artifact, load_artifact
from tiergate.errors import InputError, TiergateError
from tiergate.evaldata import EvalData, load_eval_data, validate_against
from tiergate.fingerprint import Fingerprint, fingerprint
from tiergate.gate import Decision, RunOutcome, evaluate
from tiergate.lint import Finding, lint
from tiergate.paths import home
from tiergate.policy import Policy
from tiergate.targets import DeviceClass

ROLES = ("candidate", "reference", "incumbent")
Progress = Callable[[str], None]


@dataclass
class Intake:
    """What intake learned about one artifact."""

    artifact: Artifact
    fingerprint: Fingerprint
    findings: list[Finding]

    @property
    def sha256(self) -> str:
        return self.artifact.sha256

    @property
    def lint_errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]


@dataclass
class RunSpec:
    """One artifact (by role) on one device class."""

    role: str
    device_class: DeviceClass
    intake: Intake
    image: object | None = None        # tiergate.build.BuiltImage
    build_error: str | None = None


@dataclass
class GateRun:
    """Everything one gate produced: the decision and where its evidence lies."""

    decision: Decision
    intakes: dict[str, Intake]
    outcomes: dict[str, dict[str, RunOutcome]]
    run_dirs: dict[tuple[str, str], Path]
    cache_hits: int = 0
    containers_started: int = 0
    report_files: dict[str, Path] = field(default_factory=dict)


# --- intake -----------------------------------------------------------------------------


def intake(path: Path | str, device_classes: Iterable[DeviceClass] = ()) -> Intake:
    """Load, fingerprint and lint an artifact (lint once per runtime among the device classes)."""
    artifact = load_artifact(path)
    findings: dict[tuple, Finding] = {}
    runtimes = {dc.runtime: dc for dc in device_classes} or {None: None}
    for dc in runtimes.values():
        for finding in lint(artifact, dc):
            findings.setdefault((finding.rule, finding.message, tuple(finding.nodes)), finding)
    return Intake(artifact, fingerprint(artifact), list(findings.values()))


def check_formats(intakes: dict[str, Intake], device_classes: list[DeviceClass]) -> None:
    """Every artifact must be in the format of every device class's runtime."""
    for role, item in intakes.items():
        for dc in device_classes:
            if item.artifact.format != dc.artifact_format:
                raise InputError(
                    f"{item.artifact.path}: the {role} is {item.artifact.format}, but device class "
                    f"{dc.name} runs {dc.runtime} ({dc.artifact_format} artifacts)")


def load_data(path: Path | str, intakes: dict[str, Intake]) -> EvalData:
    """The evaluation data, checked against every artifact's inputs."""
    data = load_eval_data(path)
    for item in intakes.values():
        validate_against(data, item.artifact.inputs)
    return data


# --- build and run ----------------------------------------------------------------------


def build_images(specs: list[RunSpec], *, base_image: str | None = None, ca_bundle: Path | None = None,
                 progress: Progress | None = None) -> None:
    """Build (or reuse) one image per spec; a build failure fails that spec only."""
    from tiergate.build import build_image

    for spec in specs:
        dc, item = spec.device_class, spec.intake
        _say(progress, f"image for {spec.role} on {dc.name}")
        try:
            spec.image = build_image(dc, item.artifact.path, artifact_sha256=item.sha256,
                                     fingerprint=item.fingerprint.combined, base_image=base_image,
                                     ca_bundle=ca_bundle)
        except TiergateError as exc:
            spec.build_error = f"image build failed: {exc.one_line()}"


def run_key(artifact_sha: str, device_class: str, image_id: str, data_sha: str) -> str:
    """The identity of a run's input: unchanged key, unchanged result."""
    text = "\0".join((artifact_sha, device_class, image_id, data_sha))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def runs_root() -> Path:
    return home() / "runs"


def plan_run(spec: RunSpec, data: EvalData, *, root: Path | None = None, registry=None):
    """The run folder of a spec and the job to run there, or None when nothing needs running.

    Nothing runs when the image failed to build (a failed result is saved) or when
    the same input already has a saved result (here, or in the registry).
    """
    from tiergate.execution.base import Job

    dc = spec.device_class
    folder = _run_folder(spec, data, root or runs_root())
    if spec.image is None:
        results.save(results.failed(dc.name, spec.build_error or "no image", tier=dc.tier,
                                    artifact_sha256=spec.intake.sha256), folder)
        return folder, None
    if _cached(folder) or _fetch_cached(registry, spec, data, folder):
        return folder, None
    return folder, Job(dc, data.path, folder, image=spec.image, artifact_sha256=spec.intake.sha256,
                       data_sha256=data.sha256)


def run_specs(specs: list[RunSpec], data: EvalData, *, root: Path | None = None, registry=None,
              max_parallel: int = 2, progress: Progress | None = None) -> tuple[dict[tuple[str, str], Path], int, int]:
    """Run every spec (cached ones are not run again); returns run folders, cache hits, containers started."""
    from tiergate.execution.run import run_targets

    folders: dict[tuple[str, str], Path] = {}
    jobs, hits = [], 0
    for spec in specs:
        folder, job = plan_run(spec, data, root=root, registry=registry)
        folders[(spec.role, spec.device_class.name)] = folder
        if job is not None:
            jobs.append(job)
        elif spec.image is not None:
            hits += 1
            _say(progress, f"cached: {spec.role} on {spec.device_class.name}")
    if jobs:
        _say(progress, f"running {len(jobs)} target run(s), {max_parallel} at a time")
        run_targets(jobs, max_parallel=max_parallel)
    return folders, hits, len(jobs)


def _run_folder(spec: RunSpec, data: EvalData, root: Path) -> Path:
    image_id = getattr(spec.image, "image_id", "") or "no-image"
    return root / run_key(spec.intake.sha256, spec.device_class.name, image_id, data.sha256)


def _cached(folder: Path) -> bool:
    try:
        return results.load(folder).ok and (folder / results.OUTPUTS_FILE).is_file()
    except TiergateError:
        return False


def _fetch_cached(registry, spec: RunSpec, data: EvalData, folder: Path) -> bool:
    """A result recorded in a (possibly shared) registry for exactly this input."""
    if registry is None:
        return False
    run = registry.find_cached_run(spec.intake.sha256, spec.device_class.name, spec.image.image_id, data.sha256)
    if run is None or not run.result_key:
        return False
    registry.fetch_result(run, folder)
    return _cached(folder)


def load_outcomes(folders: dict[tuple[str, str], Path]) -> dict[str, dict[str, RunOutcome]]:
    outcomes: dict[str, dict[str, RunOutcome]] = {}
    for (role, dc_name), folder in folders.items():
        outcomes.setdefault(role, {})[dc_name] = RunOutcome.load(folder)
    return outcomes


# --- the whole gate -----------------------------------------------------------------------


def gate(candidate: Path, reference: Path, data_path: Path, device_classes: list[DeviceClass],
         policy: Policy, *, incumbent: Path | None = None, base_image: str | None = None,
         ca_bundle: Path | None = None, registry=None, root: Path | None = None,
         max_parallel: int = 2, progress: Progress | None = None) -> GateRun:
    """Intake, build, run, compare and decide; user errors raise before anything runs."""
    paths = {"candidate": candidate, "reference": reference, "incumbent": incumbent}
    intakes = {role: intake(p, device_classes) for role, p in paths.items() if p is not None}
    check_formats(intakes, device_classes)
    data = load_data(data_path, intakes)
    specs = [RunSpec(role, dc, item) for role, item in intakes.items() for dc in device_classes]
    build_images(specs, base_image=base_image, ca_bundle=ca_bundle, progress=progress)
    folders, hits, started = run_specs(specs, data, root=root, registry=registry,
                                       max_parallel=max_parallel, progress=progress)
    outcomes = load_outcomes(folders)
    key = decision_key(folders, intakes, device_classes, policy)
    decision = cached_decision(key)
    if decision is None:
        decision = decide(outcomes, intakes, device_classes, policy, data)
        save_decision(key, decision)
    return GateRun(decision, intakes, outcomes, folders, hits, started)


def decide(outcomes: dict[str, dict[str, RunOutcome]], intakes: dict[str, Intake],
           device_classes: list[DeviceClass], policy: Policy, data: EvalData) -> Decision:
    """The gate decision from saved outcomes (pure computation)."""
    return evaluate(outcomes["candidate"], outcomes["reference"], {dc.name: dc for dc in device_classes},
                    policy, data.labels, outcomes.get("incumbent"),
                    quantized=intakes["candidate"].artifact.is_quantized)


# --- the decision cache: an unchanged input reuses its decision ----------------------------

_DECIDING_MODULES = ("gate.py", "stats.py", "policy.py", "metrics")


def decision_key(folders: dict[tuple[str, str], Path], intakes: dict[str, Intake],
                 device_classes: list[DeviceClass], policy: Policy) -> str:
    """Identity of everything a decision depends on: the saved results, flags, classes, policy, code."""
    digest = hashlib.sha256()
    for (role, dc_name), folder in sorted(folders.items()):
        digest.update(f"{role}|{dc_name}|{folder.name}|".encode())
        digest.update(hashlib.sha256((folder / results.RESULT_FILE).read_bytes()).digest())
    digest.update(str(intakes["candidate"].artifact.is_quantized).encode())
    for dc in device_classes:
        digest.update(json.dumps(dataclasses.asdict(dc), sort_keys=True, default=str).encode())
    digest.update(json.dumps([dataclasses.asdict(policy.defaults), policy.overrides], sort_keys=True,
                             default=str).encode())
    digest.update(_deciding_code_hash().encode())
    return digest.hexdigest()[:32]


def _deciding_code_hash() -> str:
    package = Path(__file__).parent
    digest = hashlib.sha256()
    for name in _DECIDING_MODULES:
        for path in sorted((package / name).rglob("*.py")) if (package / name).is_dir() else [package / name]:
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _decision_path(key: str) -> Path:
    return home() / "decisions" / f"{key}.pickle"


def cached_decision(key: str) -> Decision | None:
    """A decision saved by this machine for exactly this input, if any (its own cache, so pickle is safe)."""
    try:
        with _decision_path(key).open("rb") as handle:
            decision = pickle.load(handle)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    return decision if isinstance(decision, Decision) else None


def save_decision(key: str, decision: Decision) -> None:
    path = _decision_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as handle:
        pickle.dump(decision, handle, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)


def record(registry, gate_run: GateRun, *, cost_tags: dict[str, str] | None = None):
    """Record the candidate's runs and the decision in one transaction (moves aliases on PROMOTE)."""
    from tiergate.registry import NewRun, record_gate_decision

    runs = []
    for (role, _dc), folder in gate_run.run_dirs.items():
        if role != "candidate":
            continue
        result = results.load(folder)
        runs.append(NewRun.from_result(result, folder=folder if result.ok else None))
    sha = gate_run.intakes["candidate"].sha256
    return record_gate_decision(registry, sha, gate_run.decision, runs=runs, cost_tags=cost_tags)


def reusable_decision(registry, gate_run: GateRun):
    """The last recorded decision of the candidate, when no run was new and it says exactly the same."""
    if gate_run.containers_started or gate_run.cache_hits < len(gate_run.run_dirs):
        return None
    decisions = registry.decisions(artifact_sha=gate_run.intakes["candidate"].sha256)
    if not decisions:
        return None
    return decisions[-1] if decisions[-1].detail == json.loads(gate_run.decision.dumps()) else None


def record_or_reuse(registry, gate_run: GateRun, *, cost_tags: dict[str, str] | None = None):
    """(decision record, reused): an unchanged input reuses its recorded decision, no duplicate row."""
    previous = reusable_decision(registry, gate_run)
    if previous is not None:
        return previous, True
    return record(registry, gate_run, cost_tags=cost_tags), False


def write_reports(gate_run: GateRun, report_dir: Path | None, junit: Path | None) -> dict[str, Path]:
    """decision.json, summary.md (and JUnit XML) for CD; returns what was written."""
    from tiergate.reports.junit import write_junit
    from tiergate.reports.markdown import write_summary

    written: dict[str, Path] = {}
    if report_dir is not None:
        written.update(write_summary(gate_run.decision, report_dir))
    if junit is not None:
        written["junit"] = write_junit(gate_run.decision, junit)
    gate_run.report_files = written
    return written


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)
