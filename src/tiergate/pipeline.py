"""The orchestrator: one artifact's whole path, the one sequence every entry point calls.

intake -> build -> run -> compare -> decide, for the CLI (`tiergate gate`), the demo
and every Prefect flow. Three seams keep it testable without Docker:

- a `Builder` makes (or finds) the image of one artifact for one device class
  (`DockerBuilder` is the real one, `tiergate.build`);
- a backend (`tiergate.execution.base.Backend`, chosen per device class by
  `backend_for`) runs one job and leaves its result folder;
- a `Steps` runner maps a step over items: threads here (`ThreadSteps`); the
  Prefect flows pass one that submits each item as a task (orchestration/gating.py).

Running and comparing stay apart: every run writes a result folder under the
runs folder, and the decision is computed from saved folders only. An unchanged
input (same artifact, device class, image id and data) reuses its saved result:
the run folder is named by a hash of those four, written atomically under a
per-key lock (two gates of the same input share one run), and verified before
reuse (its outputs' sha256 must match). The decision is cached as JSON naming
the hashes it was made from, and used only when they all match.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import FIRST_EXCEPTION
from concurrent.futures import wait as wait_all
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tiergate import results
from tiergate.artifact import Artifact, load_artifact
from tiergate.errors import (EnvironmentProblem, InfrastructureFault, InputError, Interrupted, TiergateError, disk_full,
                             is_disk_full)
from tiergate.evaldata import (EvalData, check_labels_within, check_sample_count, is_loader, label_classes,
                               load_eval_data, normalised, run_loader, validate_against)
from tiergate.execution import janitor
from tiergate.fingerprint import Fingerprint, fingerprint
from tiergate.gate import Decision, RunOutcome, evaluate, signature_decision
from tiergate.hashing import file_sha256
from tiergate.images import BuiltImage
from tiergate.lint import Finding, lint
from tiergate.paths import home
from tiergate.policy import Policy
from tiergate.reports.gate_files import runtime_markdown, runtime_summary, write_reports  # noqa: F401
from tiergate.targets import DeviceClass

Progress = Callable[[str], None]
DECISION_SCHEMA = 1


@dataclass
class Intake:
    """What intake learned about one artifact."""

    artifact: Artifact
    fingerprint: Fingerprint
    findings: list[Finding]

    @property
    def sha256(self) -> str:
        return self.artifact.sha256


@dataclass
class RunSpec:
    """One artifact (by role) on one device class."""

    role: str
    device_class: DeviceClass
    intake: Intake
    image: BuiltImage | None = None
    build_error: str | None = None
    profile: bool = False            # per-op time in the run's device figures (harness --profile)


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
    decision_cached: bool = False
    decision_key: str = ""
    runtime: dict[str, dict] = field(default_factory=dict)            # device class -> candidate's runtime graph
    runtime_findings: dict[str, list[Finding]] = field(default_factory=dict)   # device class -> lint on it

    def runtime_summary(self) -> dict[str, dict]:
        """Per device class, what its runtime executes of the candidate: ops at the tier's own level."""
        return runtime_summary(self.runtime)


# --- the seams --------------------------------------------------------------------------------


class Builder(Protocol):
    """Makes or finds the image that runs one artifact on one device class; raises TiergateError if it cannot.

    Optionally `describe(device_class, intake, image) -> (runtime graph JSON, findings)`: what the
    class's runtime really executes of the artifact (runtime truth at intake), or None.
    """

    def build(self, device_class: DeviceClass, intake: Intake) -> BuiltImage: ...


@dataclass
class DockerBuilder:
    """The real builder: tiergate.build (runtime image + the artifact as the last layer)."""

    base_image: str | None = None
    ca_bundle: Path | None = None

    def __post_init__(self) -> None:
        if self.ca_bundle is not None:     # a bad CA bundle is the user's input: refused before anything runs
            from tiergate.build import ca_bundle_bytes

            ca_bundle_bytes(self.ca_bundle)

    def build(self, device_class: DeviceClass, intake: Intake) -> BuiltImage:
        from tiergate.build import build_image

        return build_image(device_class, intake.artifact.path, artifact_sha256=intake.sha256,
                           fingerprint=intake.fingerprint.combined, base_image=self.base_image,
                           ca_bundle=self.ca_bundle)

    def describe(self, device_class: DeviceClass, intake: Intake, image: BuiltImage):
        """The runtime graph of the artifact in the class's runtime image (cached by artifact and image)."""
        from tiergate.execution.describe import runtime_intake

        graph, findings = runtime_intake(intake.artifact, device_class, image.runtime_tag or image.tag)
        return graph.to_json(), findings


def default_backend_for(device_class: DeviceClass):
    from tiergate.execution.run import backend_for

    return backend_for(device_class)


class Steps(Protocol):
    """Maps one step over items; returns results in order, raising the first failure once all have ended."""

    def map(self, step: str, fn: Callable[[Any], Any], items: list, *, limit: int | None = None,
            name: Callable[[Any], str] = str) -> list: ...


class ThreadSteps:
    """Steps on a thread pool (the CLI and the demo).

    On an interrupt (a signal handled in the main thread) nothing queued starts, and the
    running items get `grace_s` to end (their containers are already gone) before it goes on.
    """

    grace_s = 10.0

    def map(self, step, fn, items, *, limit=None, name=str) -> list:
        if not items:
            return []
        pool = ThreadPoolExecutor(max_workers=max(1, min(limit or len(items), len(items))),
                                  thread_name_prefix=f"tiergate-{step}")
        futures = [pool.submit(fn, item) for item in items]
        try:
            wait_all(futures)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            wait_all(futures, timeout=self.grace_s)
            raise
        pool.shutdown(wait=True)
        stopped = [f for f in futures if not f.cancelled() and isinstance(f.exception(), Interrupted)]
        if stopped:
            raise stopped[0].exception()
        return [future.result() for future in futures]


def default_janitor(device_classes: list[DeviceClass]) -> None:
    """Remove containers and volumes left by killed gates on the engines these classes use."""
    hosts = {dc.docker_host or "local" for dc in device_classes if dc.execution != "local"}
    if hosts:
        swept = janitor.sweep(hosts)
        if swept.containers or swept.volumes:
            print(f"tiergate: warning: removed what killed gates left: {swept.text()}", file=sys.stderr)


@dataclass
class Seams:
    """What the orchestrator calls out to; the defaults are the real parts."""

    builder: Builder | None = None
    backend_for: Callable[[DeviceClass], Any] = default_backend_for
    steps: Steps = field(default_factory=ThreadSteps)
    janitor: Callable[[list[DeviceClass]], Any] = default_janitor


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


def load_data(source: Path | str, intakes: dict[str, Intake], sample_axes: dict[str, int] | None = None,
              policy: Policy | None = None, device_classes: Iterable[DeviceClass] = ()) -> EvalData:
    """The evaluation data, fitted to the reference's inputs (the first artifact's when there is none).

    `source` is an .npz, or a loader FILE.py:FUNCTION run once here and materialised into a
    content-hashed archive. An archive whose sample axes are not all leading is rewritten
    (content-hashed) with its axes inside, for the harness.
    """
    item = intakes.get("reference") or next(iter(intakes.values()))
    inputs = item.artifact.inputs
    if is_loader(source):
        data = run_loader(str(source), inputs, sample_axes)
    else:
        data = load_eval_data(source, inputs, sample_axes)
    validate_against(data, inputs)
    if policy is not None:     # a gate on fewer samples than its statistics resolve would promote on no evidence
        needed = max([policy.for_target(dc).min_samples for dc in device_classes] or [policy.defaults.min_samples])
        check_sample_count(data, needed, "fewer samples cannot resolve the policy's "
                                         "confidence bounds; a gate on them would promote on no evidence")
    return normalised(data)


def signature_differences(intakes: dict[str, Intake]) -> list[tuple[str, str]]:
    """(role, difference) for every input or output of the candidate (and incumbent) that differs
    from the reference's by name, dtype or shape (symbolic dimensions match anything)."""
    ref = intakes.get("reference")
    if ref is None:
        return []
    found = []
    for role in ("candidate", "incumbent"):
        if role not in intakes:
            continue
        for kind in ("inputs", "outputs"):
            theirs = {t.name: t for t in getattr(intakes[role].artifact, kind)}
            ours = {t.name: t for t in getattr(ref.artifact, kind)}
            what = kind[:-1]
            for name, spec in ours.items():
                other = theirs.get(name)
                if other is None:
                    found.append((role, f"{what} '{name}' {_spec_text(spec)} of the reference is missing"))
                elif other.dtype != spec.dtype:
                    found.append((role, f"{what} '{name}' is {other.dtype}, the reference's is {spec.dtype}"))
                elif not _shapes_agree(other.shape, spec.shape):
                    found.append((role, f"{what} '{name}' has shape {_spec_text(other)}, the reference's "
                                        f"{_spec_text(spec)}"))
            for name, other in theirs.items():
                if name not in ours:
                    found.append((role, f"{what} '{name}' {_spec_text(other)} is not in the reference"))
    return found


def _shapes_agree(a, b) -> bool:
    fixed = lambda d: isinstance(d, int) and d > 0   # noqa: E731
    return len(a) == len(b) and all(x == y or not fixed(x) or not fixed(y) for x, y in zip(a, b))


def _spec_text(spec) -> str:
    dims = ", ".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in spec.shape)
    return f"{spec.dtype}[{dims}]"


def labels_checked(data: EvalData, intakes: dict[str, Intake]) -> bool:
    """Check the labels against the reference's class count when its output shape says it (True when done)."""
    labels = data.labels
    if labels is None or labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        return True          # no class indices: nothing to check
    found = label_classes(intakes["reference"].artifact.outputs)
    if found is None:
        return False
    check_labels_within(data, *found)
    return True


def check_labels_after(data: EvalData, reference_folder: Path) -> None:
    """The labels against the class count of the reference's saved outputs (a model with dynamic shapes)."""
    from tiergate.metrics.accuracy import is_classifier

    outcome = RunOutcome.load(reference_folder)
    for name, output in (outcome.outputs or {}).items():
        if is_classifier(output):
            check_labels_within(data, name, output.size // len(output))
            return


# --- build ------------------------------------------------------------------------------


def build_images(specs: list[RunSpec], builder: Builder, *, progress: Progress | None = None) -> list[RunSpec]:
    """Build (or reuse) the image of each spec; an artifact that cannot be built fails that spec only,
    an environment problem (engine, base image, pip) raises."""
    for spec in specs:
        _say(progress, f"image for {spec.role} on {spec.device_class.name}")
        spec.image, spec.build_error = None, None
        try:
            spec.image = builder.build(spec.device_class, spec.intake)
        except EnvironmentProblem:     # no engine, no base image, pip or docker build broken: exit 2, no verdict
            raise
        except TiergateError as exc:  # this artifact cannot be built for this class: that class's run fails
            spec.build_error = f"image build failed: {exc.one_line()}"
    return specs


# --- run: cached by input identity, one run per key at a time -----------------------------


def run_key(artifact_sha: str, device_class: str, image_id: str, data_sha: str) -> str:
    """The identity of a run's input: unchanged key, unchanged result."""
    text = "\0".join((artifact_sha, device_class, image_id, data_sha))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def runs_root() -> Path:
    return home() / "runs"


@dataclass
class RunDone:
    """Where one run's result folder is, and whether it was reused or started."""

    role: str
    device_class: str
    folder: Path
    cached: bool
    started: bool


@contextmanager
def key_lock(key: str) -> Iterator[None]:
    """An exclusive lock on one key for this process's thread and every other process (fcntl)."""
    path = home() / "locks" / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(key, threading.Lock())
    with thread_lock, open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def run_one(spec: RunSpec, data: EvalData, backend, *, root: Path | None = None, registry=None,
            progress: Progress | None = None) -> RunDone:
    """Run one spec, or reuse its verified saved (or recorded) result; never two runs of one key at once.

    A failed run whose backend then reports its engine gone raises InfrastructureFault:
    an infrastructure fault is never a verdict.
    """
    dc = spec.device_class
    root = root or runs_root()
    if spec.image is None:
        folder = root / run_key(spec.intake.sha256, dc.name, "no-image", data.sha256)
        _atomic_result(folder, results.failed(dc.name, spec.build_error or "no image", tier=dc.tier,
                                              artifact_sha256=spec.intake.sha256))
        return RunDone(spec.role, dc.name, folder, cached=False, started=False)
    key = run_key(spec.intake.sha256, dc.name + ("+profile" if spec.profile else ""), spec.image.image_id,
                  data.sha256)
    folder = root / key
    caches = getattr(backend, "caches_locally", True)
    janitor.check_stop()
    with key_lock(key):
        if caches and (verified(folder) or (not spec.profile and _fetch_recorded(registry, spec, data, folder))):
            _say(progress, f"cached: {spec.role} on {dc.name}")
            return RunDone(spec.role, dc.name, folder, cached=True, started=False)
        from tiergate.execution.base import Job
        from tiergate.execution.run import execute

        janitor.check_stop()
        work = folder.with_name(f"{key}.part-{os.getpid()}-{threading.get_ident()}")
        shutil.rmtree(work, ignore_errors=True)
        job = Job(dc, data.path, work, image=spec.image, artifact_sha256=spec.intake.sha256,
                  data_sha256=data.sha256, role=spec.role, profile=spec.profile)
        _say(progress, f"running {spec.role} on {dc.name}")
        guarded = _HostFaults(backend)
        try:
            result = execute(job, guarded)
            janitor.check_stop()            # a run cut short by a stop is no result: nothing is kept
            guarded.raise_fault()
            if not result.ok:
                problem = _engine_problem(backend)
                if problem:
                    raise InfrastructureFault(f"{spec.role} on {dc.name}: the run failed and the engine is gone: "
                                              f"{problem}")
            else:
                result.outputs_sha256 = file_sha256(work / results.OUTPUTS_FILE)
                results.save(result, work)
            _replace_dir(work, folder)
        except OSError as exc:
            shutil.rmtree(work, ignore_errors=True)
            if is_disk_full(exc):
                raise disk_full(exc, folder.parent) from None
            raise
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    janitor.note_finished()
    reused = bool(result.extra.get("reused"))     # a backend whose far side reused a recorded run says so
    return RunDone(spec.role, dc.name, folder, cached=reused, started=not reused)


class _HostFaults:
    """A backend wrapper that keeps a full disk (ENOSPC) from becoming a failed run, hence a verdict."""

    def __init__(self, backend):
        self.backend, self.fault = backend, None
        self.name = getattr(backend, "name", "backend")

    def run(self, job):
        try:
            return self.backend.run(job)
        except OSError as exc:
            if is_disk_full(exc):
                self.fault = disk_full(exc, job.out_dir.parent)
            raise

    def raise_fault(self) -> None:
        if self.fault is not None:
            raise self.fault


def verified(folder: Path) -> bool:
    """A saved ok result whose outputs are the ones it names; anything else is discarded (with a warning)."""
    if not (folder / results.RESULT_FILE).exists():
        return False
    try:
        result = results.load(folder)
        ok = (result.ok and result.outputs_sha256 != ""
              and file_sha256(folder / results.OUTPUTS_FILE) == result.outputs_sha256)
    except (TiergateError, OSError):
        ok = False
    if not ok:
        print(f"tiergate: warning: discarding the saved run {folder.name} (failed, or it does not verify); "
              "running it again", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)
    return ok


def _fetch_recorded(registry, spec: RunSpec, data: EvalData, folder: Path) -> bool:
    """A result recorded in a (possibly shared) registry for exactly this input."""
    if registry is None:
        return False
    run = registry.find_cached_run(spec.intake.sha256, spec.device_class.name, spec.image.image_id, data.sha256)
    if run is None or not run.result_key:
        return False
    work = folder.with_name(f"{folder.name}.part-{os.getpid()}-{threading.get_ident()}")
    try:
        registry.fetch_result(run, work)
    except (TiergateError, OSError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise disk_full(exc, work.parent) from None
        print(f"tiergate: warning: the recorded run {run.id} cannot be fetched ({_one_line(exc)}); "
              "running it again", file=sys.stderr)
        return False
    _replace_dir(work, folder)
    return verified(folder)


def _engine_problem(backend) -> str | None:
    probe = getattr(backend, "engine_problem", None)
    return probe() if probe is not None else None


def _one_line(exc: BaseException) -> str:
    return exc.one_line() if isinstance(exc, TiergateError) else " ".join(str(exc).split())[:300]


def _atomic_result(folder: Path, result: results.TargetResult) -> None:
    work = folder.with_name(f"{folder.name}.part-{os.getpid()}-{threading.get_ident()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        results.save(result, work)
        _replace_dir(work, folder)
    except OSError as exc:
        shutil.rmtree(work, ignore_errors=True)
        if is_disk_full(exc):
            raise disk_full(exc, folder.parent) from None
        raise


def _replace_dir(work: Path, folder: Path) -> None:
    """Put a finished folder in place (a rename in the same directory); the old one goes first."""
    if folder.exists():
        old = folder.with_name(f"{folder.name}.old-{os.getpid()}-{threading.get_ident()}")
        folder.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    work.rename(folder)


def run_specs(specs: list[RunSpec], data: EvalData, seams: Seams, *, root: Path | None = None, registry=None,
              max_parallel: int = 2, progress: Progress | None = None) -> list[RunDone]:
    """Run every spec (verified saved results are reused), `max_parallel` at a time."""
    def one(spec: RunSpec) -> RunDone:
        return run_one(spec, data, seams.backend_for(spec.device_class), root=root, registry=registry,
                       progress=progress)

    return seams.steps.map("run", one, specs, limit=max_parallel,
                           name=lambda s: f"{s.role} on {s.device_class.name}")


def load_outcomes(folders: dict[tuple[str, str], Path]) -> dict[str, dict[str, RunOutcome]]:
    outcomes: dict[str, dict[str, RunOutcome]] = {}
    for (role, dc_name), folder in folders.items():
        outcomes.setdefault(role, {})[dc_name] = RunOutcome.load(folder)
    return outcomes


# --- the whole gate -----------------------------------------------------------------------


def gate(candidate: Path, reference: Path, data_path: Path | str, device_classes: list[DeviceClass],
         policy: Policy, *, incumbent: Path | None = None, base_image: str | None = None,
         ca_bundle: Path | None = None, registry=None, root: Path | None = None,
         max_parallel: int = 2, progress: Progress | None = None, seams: Seams | None = None,
         sample_axes: dict[str, int] | None = None, metrics: list[str] | None = None,
         profile: bool = False) -> GateRun:
    """Intake, signature check, build, run, compare and decide; user errors raise before anything runs.

    `data_path`: an .npz or a loader FILE.py:FUNCTION; `sample_axes`: explicit {name: axis};
    `metrics`: task metrics by name, built-in or FILE.py:FUNCTION (tiergate.metrics.task).
    A candidate (or incumbent) whose signature differs from the reference's is rejected with
    the differences named, before anything is built or run. `profile`: every run also records
    per-op time (a run of its own, cached apart).
    """
    seams = seams or Seams()
    builder = seams.builder or DockerBuilder(base_image, ca_bundle)
    seams.janitor(device_classes)
    paths = {"candidate": candidate, "reference": reference, "incumbent": incumbent}
    roles = [(role, p) for role, p in paths.items() if p is not None]
    intakes = dict(zip([r for r, _ in roles],
                       seams.steps.map("intake", lambda rp: intake(rp[1], device_classes), roles,
                                       name=lambda rp: rp[0])))
    check_formats(intakes, device_classes)
    data = load_data(data_path, intakes, sample_axes, policy, device_classes)
    task = resolve_metrics(metrics, policy)
    differences = signature_differences(intakes)
    if differences:
        _say(progress, "signature differs from the reference's: nothing built or run")
        decision = signature_decision(differences, device_classes, policy,
                                      quantized=intakes["candidate"].artifact.is_quantized)
        return GateRun(decision, intakes, {}, {})
    labels_known = labels_checked(data, intakes)
    specs = [RunSpec(role, dc, item, profile=profile) for role, item in intakes.items() for dc in device_classes]
    per_class = [[s for s in specs if s.device_class.name == dc.name] for dc in device_classes]

    def build_and_describe(group: list[RunSpec]):
        build_images(group, builder, progress=progress)
        return describe_candidate(group, builder, progress=progress)

    described = seams.steps.map("build", build_and_describe, per_class, limit=1,
                                name=lambda group: group[0].device_class.name)
    if labels_known:
        done = run_specs(specs, data, seams, root=root, registry=registry, max_parallel=max_parallel,
                         progress=progress)
    else:   # dynamic output shape: the class count is known from the reference's first run, before candidates
        first = [s for s in specs if s.role == "reference"][:1]
        done = run_specs(first, data, seams, root=root, registry=registry, max_parallel=max_parallel,
                         progress=progress)
        check_labels_after(data, done[0].folder)
        done += run_specs([s for s in specs if s not in first], data, seams, root=root, registry=registry,
                          max_parallel=max_parallel, progress=progress)
    folders = {(d.role, d.device_class): d.folder for d in done}
    run = decide_saved(folders, intakes, device_classes, policy, data,
                       cache_hits=sum(d.cached for d in done), started=sum(d.started for d in done), metrics=task)
    for dc, item in zip(device_classes, described):
        if item is not None:
            run.runtime[dc.name], run.runtime_findings[dc.name] = item
    return run


def describe_candidate(group: list[RunSpec], builder: Builder, *, progress: Progress | None = None):
    """The candidate's runtime graph and its findings on one device class, or None (no image, no describer)."""
    describe = getattr(builder, "describe", None)
    spec = next((s for s in group if s.role == "candidate"), None)
    if describe is None or spec is None or spec.image is None:
        return None
    _say(progress, f"runtime graph of the candidate on {spec.device_class.name}")
    try:
        return describe(spec.device_class, spec.intake, spec.image)
    except InfrastructureFault:
        raise
    except TiergateError as exc:
        return ({"target": spec.device_class.name, "ok": False, "error": exc.one_line()},
                [Finding("runtime-graph", "warning", f"could not describe the runtime graph on "
                         f"{spec.device_class.name}: {exc.one_line()}", basis="runtime",
                         target=spec.device_class.name)])


def decide_saved(folders: dict[tuple[str, str], Path], intakes: dict[str, Intake],
                 device_classes: list[DeviceClass], policy: Policy, data: EvalData, *,
                 cache_hits: int = 0, started: int = 0, metrics=None) -> GateRun:
    """The decision from saved run folders: from the decision cache when every input it names matches."""
    outcomes = load_outcomes(folders)
    metrics = metrics if metrics is not None else resolve_metrics(None, policy)
    inputs = decision_inputs(folders, intakes, device_classes, policy, data, metrics)
    key = decision_key_of(inputs)
    decision = cached_decision(key, inputs)
    cached = decision is not None
    if decision is None:
        decision = decide(outcomes, intakes, device_classes, policy, data, metrics)
        save_decision(key, inputs, decision)
    return GateRun(decision, intakes, outcomes, folders, cache_hits, started, decision_cached=cached,
                   decision_key=key)


def decide(outcomes: dict[str, dict[str, RunOutcome]], intakes: dict[str, Intake],
           device_classes: list[DeviceClass], policy: Policy, data: EvalData, metrics=None) -> Decision:
    """The gate decision from saved outcomes (pure computation)."""
    return evaluate(outcomes["candidate"], outcomes["reference"], {dc.name: dc for dc in device_classes},
                    policy, data.labels, outcomes.get("incumbent"),
                    quantized=intakes["candidate"].artifact.is_quantized,
                    metrics=metrics if metrics is not None else resolve_metrics(None, policy),
                    carried=carried_outputs(intakes["reference"].artifact))


def carried_outputs(artifact: Artifact) -> frozenset[str]:
    """Outputs that carry an input's state to the next call (silero's state -> stateN, state_in -> state_out),
    never class scores: named after the input (a common prefix of 4+ characters), same dtype and rank, and no
    fixed dimension that differs."""
    def carries(o, i) -> bool:
        return (len(os.path.commonprefix([o.name, i.name])) >= 4 and o.dtype == i.dtype
                and len(o.shape) == len(i.shape) > 1 and _shapes_agree(o.shape, i.shape))

    return frozenset(o.name for o in artifact.outputs if any(carries(o, i) for i in artifact.inputs))


def resolve_metrics(names: list[str] | None, policy: Policy):
    """The task metrics to compute: the policy's [metrics.NAME] tables and --metric names (built-in or
    FILE.py:FUNCTION, imported here once)."""
    from tiergate.metrics.task import resolve

    return resolve(names or [], policy)


# --- the decision cache: JSON naming every hash it was made from ----------------------------

_DECIDING_MODULES = ("gate.py", "stats.py", "policy.py", "codec.py", "metrics", "evaldata.py")


def decision_inputs(folders: dict[tuple[str, str], Path], intakes: dict[str, Intake],
                    device_classes: list[DeviceClass], policy: Policy, data: EvalData, metrics=()) -> dict:
    """Everything a decision depends on, by hash: artifacts, data, runs, images, classes, policy, code."""
    def sha_text(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    runs, images = {}, {}
    for (role, dc_name), folder in sorted(folders.items()):
        raw = (folder / results.RESULT_FILE).read_bytes()
        runs[f"{role}/{dc_name}"] = f"{folder.name}:{hashlib.sha256(raw).hexdigest()}"
        images[f"{role}/{dc_name}"] = json.loads(raw).get("image_id", "")
    classes = [json.dumps(dataclasses.asdict(dc), sort_keys=True, default=str) for dc in device_classes]
    return {
        "candidate": intakes["candidate"].sha256,
        "reference": intakes["reference"].sha256,
        "incumbent": intakes["incumbent"].sha256 if "incumbent" in intakes else None,
        "quantized": intakes["candidate"].artifact.is_quantized,
        "data": data.sha256,
        "device_classes": sha_text("\n".join(classes)),
        "policy": sha_text(json.dumps([dataclasses.asdict(policy.defaults), policy.overrides,
                                       policy.metrics], sort_keys=True, default=str)),
        "metrics": [m.identity for m in metrics or ()],
        "code": _deciding_code_hash(),
        "runs": runs,
        "images": images,
    }


def decision_key_of(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def _deciding_code_hash() -> str:
    package = Path(__file__).parent
    digest = hashlib.sha256()
    for name in _DECIDING_MODULES:
        for path in sorted((package / name).rglob("*.py")) if (package / name).is_dir() else [package / name]:
            digest.update(path.read_bytes())
    return digest.hexdigest()


def decision_path(key: str) -> Path:
    return home() / "decisions" / f"{key}.json"


def cached_decision(key: str, inputs: dict) -> Decision | None:
    """The saved decision for exactly these inputs; a file that does not verify is discarded with a warning."""
    path = decision_path(key)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        doc = None
    try:
        if doc is not None and doc.get("schema") == DECISION_SCHEMA and doc.get("key") == key \
                and doc.get("inputs") == inputs:
            return Decision.from_json(doc["decision"])
    except (TiergateError, KeyError, TypeError, ValueError):
        pass
    print(f"tiergate: warning: discarding the cached decision {path.name}: it does not match its inputs",
          file=sys.stderr)
    path.unlink(missing_ok=True)
    return None


def save_decision(key: str, inputs: dict, decision: Decision) -> Path:
    """Write the decision with its inputs, atomically (temp file + rename in the same folder)."""
    path = decision_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": DECISION_SCHEMA, "key": key, "created_at": datetime.now(timezone.utc).isoformat(
        timespec="seconds"), "inputs": inputs, "decision": decision.to_json()}
    tmp = path.with_name(f"{path.name}.part-{os.getpid()}-{threading.get_ident()}")
    try:
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False))
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(exc, path.parent) from None
        raise
    return path


def record(registry, gate_run: GateRun, *, cost_tags: dict[str, str] | None = None, reuse_same: bool = False):
    """Record the candidate's runs and the decision in one transaction (moves aliases on PROMOTE)."""
    from tiergate.registry import NewRun, record_gate_decision

    runs = []
    for (role, _dc), folder in gate_run.run_dirs.items():
        if role != "candidate":
            continue
        result = results.load(folder)
        runs.append(NewRun.from_result(result, folder=folder if result.ok else None))
    sha = gate_run.intakes["candidate"].sha256
    detail = gate_run.decision.to_json()
    if gate_run.runtime:
        detail["runtime"] = gate_run.runtime_summary()
    return record_gate_decision(registry, sha, detail, runs=runs, cost_tags=cost_tags, reuse_same=reuse_same)


def reusable_decision(registry, gate_run: GateRun):
    """The last recorded decision of the candidate, when no run was new and it says exactly the same."""
    if gate_run.containers_started or gate_run.cache_hits < len(gate_run.run_dirs):
        return None
    decisions = registry.decisions(artifact_sha=gate_run.intakes["candidate"].sha256)
    if not decisions:
        return None
    recorded = {k: v for k, v in decisions[-1].detail.items() if k != "runtime"}
    return decisions[-1] if recorded == json.loads(gate_run.decision.dumps()) else None


def record_or_reuse(registry, gate_run: GateRun, *, cost_tags: dict[str, str] | None = None):
    """(decision record, reused): an unchanged input reuses its recorded decision, no duplicate row."""
    previous = reusable_decision(registry, gate_run)
    if previous is not None:
        return previous, True
    # checked again inside the write: a concurrent gate of the same input may have just recorded it
    recorded = record(registry, gate_run, cost_tags=cost_tags, reuse_same=True)
    return recorded, recorded.reused


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)
