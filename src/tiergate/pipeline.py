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
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import FIRST_EXCEPTION
from concurrent.futures import wait as wait_all
from contextlib import ExitStack, contextmanager
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
                               load_eval_data, normalised, run_loader, subset, validate_against)
from tiergate.execution import janitor
from tiergate.fingerprint import Fingerprint, fingerprint
from tiergate.gate import (EARLY_METHOD, Decision, RunOutcome, TierLooks, combine_tiers, cross_tier_drift, evaluate,
                           settled, signature_decision, verdict_of)
from tiergate.hashing import file_sha256
from tiergate.images import BuiltImage
from tiergate.lint import Finding, lint
from tiergate.paths import home
from tiergate.policy import EarlyStop, Policy
from tiergate.reports.gate_files import runtime_markdown, runtime_summary, write_reports  # noqa: F401
from tiergate.stats import CUSTOM_MAX_RESAMPLES, Look, look_plan
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
    """Run one spec (a tier of one artifact; see run_tier)."""
    return run_tier([spec], data, backend, root=root, registry=registry, progress=progress)[0]


def spec_key(spec: RunSpec, data: EvalData) -> str:
    """The run key of a spec: what it runs, where, in which image, on which data, how it evaluates."""
    dc = spec.device_class
    ev = dc.evaluation
    how = (("+profile" if spec.profile else "")
           + (f"+batch{ev.batch}-latency{ev.latency_calls}" if ev.batch > dc.batch_size else "")
           + (f"+cpu-{dc.emulated_cpu}" if dc.emulated_cpu else ""))
    return run_key(spec.intake.sha256, dc.name + how, spec.image.image_id, data.sha256)


def shard_ranges(n: int, count: int) -> list[tuple[int, int]]:
    """`count` consecutive ranges of n samples, as even as can be."""
    count = max(1, min(count, n))
    edges = [round(i * n / count) for i in range(count + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:])]


def run_tier(specs: list[RunSpec], data: EvalData, backend, *, shards: int | None = None, root: Path | None = None,
             registry=None, progress: Progress | None = None, slots: threading.Semaphore | None = None
             ) -> list[RunDone]:
    """Run the specs of one device class, reusing each verified saved (or recorded) result; a RunDone each.

    What must run runs together: the pending artifacts (candidate, reference, incumbent) in one harness
    start per shard (`backend.run_many`), each shard a range of the samples (`shards`, else the class's
    `[evaluation] shards`), in parallel within `slots`. Each artifact's run is still saved (and cached) on
    its own, under its run key; a shard that finished is kept under runs/<key>.shards/ until every shard of
    that artifact has, then the shards are merged in sample order. A failed shard fails that artifact's run
    on this tier (the finished shards stay for the re-run). Never two runs of one key at once. A failed run
    whose backend then reports its engine gone raises InfrastructureFault: never a verdict.
    """
    dc = specs[0].device_class
    root = root or runs_root()
    done: dict[int, RunDone] = {}
    keyed: list[tuple[int, RunSpec, str]] = []
    for i, spec in enumerate(specs):
        if spec.image is None:
            folder = root / run_key(spec.intake.sha256, dc.name, "no-image", data.sha256)
            _atomic_result(folder, results.failed(dc.name, spec.build_error or "no image", tier=dc.tier,
                                                  artifact_sha256=spec.intake.sha256))
            done[i] = RunDone(spec.role, dc.name, folder, cached=False, started=False)
        else:
            keyed.append((i, spec, spec_key(spec, data)))
    caches = getattr(backend, "caches_locally", True)
    janitor.check_stop()
    with ExitStack() as locks:
        for key in sorted({key for _, _, key in keyed}):     # one order everywhere: no deadlock between gates
            locks.enter_context(key_lock(key))
        pending: dict[str, RunSpec] = {}
        for i, spec, key in keyed:
            folder = root / key
            if key in pending:                  # the same artifact in two roles (a model against itself)
                continue
            if caches and (verified(folder) or (not spec.profile and _fetch_recorded(registry, spec, data, folder))):
                _say(progress, f"cached: {spec.role} on {dc.name}")
                done[i] = RunDone(spec.role, dc.name, folder, cached=True, started=False)
            else:
                pending[key] = spec
        started = _run_pending(pending, data, backend, shards, root, progress, slots) if pending else {}
        for i, spec, key in keyed:
            if i not in done:
                first = started[key] is not None and started[key].role == spec.role
                reused = bool(first and started[key].reused)
                done[i] = RunDone(spec.role, dc.name, root / key, cached=not first or reused,
                                  started=first and not reused)
    return [done[i] for i in range(len(specs))]


@dataclass
class _Started:
    role: str
    reused: bool          # a backend whose far side reused a recorded run says so


def _run_pending(pending: dict[str, RunSpec], data: EvalData, backend, shards: int | None, root: Path,
                 progress: Progress | None, slots) -> dict[str, _Started | None]:
    """Run the pending keys (their locks held) over shards; every key's folder is in place on return."""
    from tiergate.execution.base import Job
    from tiergate.execution.run import execute_group

    first = next(iter(pending.values()))
    dc = first.device_class
    ev = dc.evaluation
    count = ev.shard_count(dc, data.n_samples, shards) if getattr(backend, "takes_samples", False) else 1
    ranges = shard_ranges(data.n_samples, count)
    sharded = len(ranges) > 1
    latency_calls = max(-(-ev.latency_calls // len(ranges)), min(4, ev.latency_calls))
    tag = f"{os.getpid()}-{threading.get_ident()}"
    works = {key: root / f"{key}.part-{tag}" for key in pending}

    def part_dir(key: str, span: tuple[int, int]) -> Path:
        return root / f"{key}{results.SHARDS_SUFFIX}" / f"{span[0]}-{span[1]}"

    todo = [(span, [key for key in pending if not (sharded and verified(part_dir(key, span), quiet=True))])
            for span in ranges]
    todo = [(span, keys) for span, keys in todo if keys]
    guarded = _HostFaults(backend)
    placed: set[tuple[str, tuple[int, int]]] = set()     # put in place as soon as the harness finished it
    placed_guard = threading.Lock()

    def place(key: str, span: tuple[int, int], out: Path, t0: float, started_at: str):
        """Job.on_done: an artifact the backend read back while the others still run goes in place at once (a
        stop, a later failure, even a killed gate, then lose nothing already measured)."""
        def done(result: results.TargetResult) -> None:
            stamp = {"started_at": started_at, "wall_s": round(time.monotonic() - t0, 3)}
            if _keep_finished(out, part_dir(key, span) if sharded else root / key, stamp):
                with placed_guard:
                    placed.add((key, span))
                if not sharded:
                    janitor.note_finished()
        return done

    def run_span(item) -> list[results.TargetResult]:
        span, keys = item
        outs = {key: works[key] if not sharded else part_dir(key, span).with_name(f"{span[0]}-{span[1]}.part-{tag}")
                for key in keys}
        for out in outs.values():
            shutil.rmtree(out, ignore_errors=True)
        roles = ", ".join(pending[key].role for key in keys)
        where = f" samples {span[0]}-{span[1]}" if sharded else ""
        with slots if slots is not None else _no_slot():
            janitor.check_stop()
            _say(progress, f"running {roles} on {dc.name}{where}")
            t0, started_at = time.monotonic(), datetime.now(timezone.utc).isoformat(timespec="seconds")
            jobs = [Job(dc, data.path, outs[key], image=pending[key].image,
                        artifact_path=pending[key].intake.artifact.path, artifact_sha256=pending[key].intake.sha256,
                        data_sha256=data.sha256, role=pending[key].role, profile=pending[key].profile,
                        samples=span if sharded else None, eval_batch=ev.batch, latency_calls=latency_calls,
                        on_done=place(key, span, outs[key], t0, started_at)) for key in keys]
            ran = execute_group(jobs, guarded)
        janitor.check_stop()               # a run cut short by a stop is no result: only what finished is kept
        guarded.raise_fault()
        for key, job, result in zip(keys, jobs, ran):
            if (key, span) in placed:
                continue
            if result.ok:
                result.outputs_sha256 = file_sha256(job.out_dir / results.OUTPUTS_FILE)
                results.save(result, job.out_dir)
                if sharded:                # a finished shard is kept, whatever happens to the others
                    job.out_dir.parent.mkdir(parents=True, exist_ok=True)
                    _replace_dir(job.out_dir, part_dir(key, span))
            elif sharded:                  # the failure is reported with the artifact's run
                shutil.rmtree(job.out_dir, ignore_errors=True)
        return ran

    try:
        outcome = _map_threads(run_span, todo)
        failures = {}
        for (span, keys), ran in zip(todo, outcome):
            for key, result in zip(keys, ran):
                if not result.ok:
                    failures.setdefault(key, (span, result))
        if failures:
            problem = _engine_problem(backend)
            if problem:
                raise InfrastructureFault(f"on {dc.name}: the run failed and the engine is gone: {problem}")
        started: dict[str, _Started | None] = {}
        for key, spec in pending.items():
            if key in failures:
                span, result = failures[key]
                if sharded:
                    result.reason = f"shard {ranges.index(span) + 1} of {len(ranges)} (samples {span[0]}-{span[1]}): " \
                                    f"{result.reason}"
                    result.extra = {**result.extra, "shards_kept": [f"{a}-{b}" for a, b in ranges
                                                                    if verified(part_dir(key, (a, b)), quiet=True)]}
                shutil.rmtree(works[key], ignore_errors=True)
                results.save(result, works[key])
            elif sharded:
                merge_shards([part_dir(key, span) for span in ranges], works[key])
            if key in failures or (key, ranges[0]) not in placed or sharded:
                _replace_dir(works[key], root / key)
                janitor.note_finished()
            if sharded and key not in failures:
                shutil.rmtree(root / f"{key}{results.SHARDS_SUFFIX}", ignore_errors=True)
            ran_any = any(key in keys for _, keys in todo)
            started[key] = _Started(spec.role, bool(results.load(root / key).extra.get("reused"))) if ran_any else None
        return started
    except BaseException as exc:
        disk = isinstance(exc, OSError) and is_disk_full(exc)
        for key, work in works.items():           # an interrupted start keeps what it finished (and verifies it)
            if not disk and _keep_finished(work, root / key):
                janitor.note_finished()
        for span, keys in todo:
            for key in keys:
                part = part_dir(key, span).with_name(f"{span[0]}-{span[1]}.part-{tag}")
                if not disk and _keep_finished(part, part_dir(key, span)):
                    continue
                shutil.rmtree(part, ignore_errors=True)
        for work in works.values():
            shutil.rmtree(work, ignore_errors=True)
        if disk:
            raise disk_full(exc, root) from None
        raise


def _keep_finished(work: Path, folder: Path, stamp: dict | None = None) -> bool:
    """Put in place an artifact's run that its backend finished and saved before the whole start ended (the
    harness finished it, the host read it back): a stop or a failure of a later artifact does not lose it."""
    try:
        result = results.load(work)
        if not (result.ok and result.image_id and result.data_sha256 and (work / results.OUTPUTS_FILE).is_file()):
            return False
        for name, value in (stamp or {}).items():
            setattr(result, name, value)
        result.outputs_sha256 = file_sha256(work / results.OUTPUTS_FILE)
        results.save(result, work)
        folder.parent.mkdir(parents=True, exist_ok=True)
        _replace_dir(work, folder)
        return True
    except (TiergateError, OSError):
        return False


@contextmanager
def _no_slot():
    yield


def _map_threads(fn, items: list) -> list:
    """fn over items on threads, results in order; the first failure raised once all have ended."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="tiergate-shard") as pool:
        futures = [pool.submit(fn, item) for item in items]
        wait_all(futures)
    return [future.result() for future in futures]


def merge_shards(parts: list[Path], work: Path, spans: list[tuple[int, int]] | None = None) -> results.TargetResult:
    """One artifact's run from its shards' folders (in sample order): outputs concatenated per sample, latencies
    of every shard's timed calls, device figures of the first shard; extra.shards says what each did.
    `spans`: the samples of each part (default: from the parts' names, START-STOP)."""
    loaded = [results.load(part) for part in parts]
    first = loaded[0]
    mixed = [r for r in loaded[1:] if (r.machine, r.versions, r.image_id) != (first.machine, first.versions,
                                                                             first.image_id)]
    if mixed:
        result = results.failed(first.device_class, f"shards ran on different machines or runtimes "
                                f"({first.machine} {first.versions} vs {mixed[0].machine} {mixed[0].versions})",
                                tier=first.tier, artifact_sha256=first.artifact_sha256)
        results.save(result, work)
        return result
    outputs = [results.load_outputs(part) for part in parts]
    merged = {name: np.concatenate([o[name] for o in outputs]) for name in outputs[0]}
    evaluations = [r.extra.get("evaluation", {}) for r in loaded]
    evaluation = {**evaluations[0],
                  "batched": all(e.get("batched", False) for e in evaluations),
                  "latency_calls": sum(len(r.latencies_ns) for r in loaded)}
    if all("eval_calls" in e for e in evaluations):
        evaluation.update(eval_calls=sum(e["eval_calls"] for e in evaluations),
                          checked_samples=sum(e.get("checked_samples", 0) for e in evaluations),
                          max_abs_diff=max(e.get("max_abs_diff", 0.0) for e in evaluations),
                          eval_ms_per_sample=sum(e["eval_ms_per_sample"] * r.n_samples
                                                 for e, r in zip(evaluations, loaded)) / sum(r.n_samples for r in loaded))
    reasons = [e["reason"] for e in evaluations if e.get("reason")]
    if reasons:
        evaluation["reason"] = reasons[0]
    shards = [{"samples": [int(a), int(b)], "wall_s": r.wall_s, "started_at": r.started_at,
               "latency_calls": len(r.latencies_ns)}
              for r, (a, b) in zip(loaded, spans or (map(int, part.name.split("-")) for part in parts))]
    result = dataclasses.replace(
        first, n_samples=sum(r.n_samples for r in loaded), latencies_ns=[x for r in loaded for x in r.latencies_ns],
        started_at=min(r.started_at for r in loaded), wall_s=max(r.wall_s for r in loaded),
        extra={**first.extra, "evaluation": evaluation, "shards": shards}, outputs_sha256="")
    results.save(result, work, merged)
    result.outputs_sha256 = file_sha256(work / results.OUTPUTS_FILE)
    results.save(result, work)
    return result


class _HostFaults:
    """A backend wrapper that keeps a full disk (ENOSPC) from becoming a failed run, hence a verdict."""

    def __init__(self, backend):
        self.backend, self.fault = backend, None
        self.name = getattr(backend, "name", "backend")
        if hasattr(backend, "run_many"):
            self.run_many = lambda jobs: self._guard(lambda: backend.run_many(jobs), jobs[0])

    def run(self, job):
        return self._guard(lambda: self.backend.run(job), job)

    def _guard(self, call, job):
        try:
            return call()
        except OSError as exc:
            if is_disk_full(exc):
                self.fault = disk_full(exc, job.out_dir.parent)
            raise

    def raise_fault(self) -> None:
        if self.fault is not None:
            raise self.fault


def verified(folder: Path, *, quiet: bool = False) -> bool:
    """A saved ok result whose outputs are the ones it names; anything else is discarded (with a warning,
    unless `quiet`)."""
    if not (folder / results.RESULT_FILE).exists():
        return False
    try:
        result = results.load(folder)
        ok = (result.ok and result.outputs_sha256 != ""
              and file_sha256(folder / results.OUTPUTS_FILE) == result.outputs_sha256)
    except (TiergateError, OSError):
        ok = False
    if not ok:
        if not quiet:
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


def run_specs(specs: list[RunSpec], data: EvalData | dict[str, EvalData], seams: Seams, *, root: Path | None = None,
              registry=None, max_parallel: int = 2, progress: Progress | None = None,
              shards: int | None = None, describe: Describing | None = None) -> list[RunDone]:
    """Run every spec (verified saved results are reused): one step per device class (run_tier), every tier at
    once, at most `max_parallel` containers (or processes) running at a time; RunDones in the specs' order.
    `data`: the samples of every tier, or per device class name (an early decision's chunks). `describe`: each
    tier's candidate is described (once) in its step before its runs, within the same slots."""
    tiers: dict[str, list[RunSpec]] = {}
    for spec in specs:
        tiers.setdefault(spec.device_class.name, []).append(spec)
    slots = threading.BoundedSemaphore(max(1, max_parallel))

    def one(group: list[RunSpec]) -> list[RunDone]:
        if describe is not None:
            describe(group, slots)
        tier_data = data if isinstance(data, EvalData) else data[group[0].device_class.name]
        return run_tier(group, tier_data, seams.backend_for(group[0].device_class), shards=shards, root=root,
                        registry=registry, progress=progress, slots=slots)

    groups = list(tiers.values())
    ran = seams.steps.map("run", one, groups, limit=len(groups), name=lambda g: g[0].device_class.name)
    by_spec = {id(spec): done for group, dones in zip(groups, ran) for spec, done in zip(group, dones)}
    return [by_spec[id(spec)] for spec in specs]


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
         profile: bool = False, shards: int | None = None, early_stop: bool | None = None) -> GateRun:
    """Intake, signature check, build, run, compare and decide; user errors raise before anything runs.

    `data_path`: an .npz or a loader FILE.py:FUNCTION; `sample_axes`: explicit {name: axis};
    `metrics`: task metrics by name, built-in or FILE.py:FUNCTION (tiergate.metrics.task).
    A candidate (or incumbent) whose signature differs from the reference's is rejected with
    the differences named, before anything is built or run. `profile`: every run also records
    per-op time (a run of its own, cached apart). `shards`: containers per tier run (default: each class's
    `[evaluation] shards`); the decision never depends on it. `early_stop`: decide each tier at the first look
    (a growing prefix of the samples) whose verdict is settled (see gate_early); None: as the policy says
    (`early_stop`, off by default), True / False: on / off for every tier.
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

    seams.steps.map("build", lambda group: build_images(group, builder, progress=progress), per_class, limit=1,
                    name=lambda group: group[0].device_class.name)
    describing = Describing(builder, progress)      # in each tier's run step, while the other tiers run
    early = early_settings(policy, device_classes, early_stop)
    if early:
        run = gate_early(specs, data, intakes, device_classes, policy, early, seams, metrics=task,
                         labels_known=labels_known, root=root, registry=registry, max_parallel=max_parallel,
                         progress=progress, shards=shards, describe=describing)
    else:
        run = _gate_whole(specs, data, intakes, device_classes, policy, seams, metrics=task,
                          labels_known=labels_known, root=root, registry=registry, max_parallel=max_parallel,
                          progress=progress, shards=shards, describe=describing)
    for dc in device_classes:
        item = describing.done.get(dc.name)
        if item is not None:
            run.runtime[dc.name], run.runtime_findings[dc.name] = item
    return run


def _gate_whole(specs: list[RunSpec], data: EvalData, intakes: dict[str, Intake], device_classes: list[DeviceClass],
                policy: Policy, seams: Seams, *, metrics, labels_known: bool, root: Path | None, registry,
                max_parallel: int, progress: Progress | None, shards: int | None,
                describe: Describing | None = None) -> GateRun:
    """Every spec on every sample, then the decision (the gate without early stop)."""
    _, done = _run_checking_labels(specs, data, data, seams, labels_known, root=root, registry=registry,
                                   max_parallel=max_parallel, progress=progress, shards=shards, describe=describe)
    folders = {(d.role, d.device_class): d.folder for d in done}
    return decide_saved(folders, intakes, device_classes, policy, data,
                        cache_hits=sum(d.cached for d in done), started=sum(d.started for d in done), metrics=metrics)


def _run_checking_labels(specs: list[RunSpec], runs_data, data: EvalData, seams: Seams, labels_known: bool,
                         **options) -> tuple[list[RunSpec], list[RunDone]]:
    """run_specs; when the class count is unknown (dynamic output shape) the reference runs first and the labels
    are checked against its outputs before the candidates run. (the specs in the order run, their RunDones)"""
    if labels_known:
        return specs, run_specs(specs, runs_data, seams, **options)
    first = [s for s in specs if s.role == "reference"][:1]
    done = run_specs(first, runs_data, seams, **options)
    check_labels_after(data, done[0].folder)
    rest = [s for s in specs if s not in first]
    return first + rest, done + run_specs(rest, runs_data, seams, **options)

# --- early decision: sequential looks at growing sample prefixes ---------------------------------


def early_settings(policy: Policy, device_classes: list[DeviceClass], early_stop: bool | None) -> dict[str, EarlyStop]:
    """Each class's early-decision settings when any class has it on (`early_stop` True/False: every class);
    {} when it is off everywhere (the gate as it always was)."""
    settings = {dc.name: policy.early_stop_for(dc) for dc in device_classes}
    if early_stop is not None:
        settings = {name: dataclasses.replace(e, enabled=early_stop) for name, e in settings.items()}
    return settings if any(e.enabled for e in settings.values()) else {}


@dataclass
class _Tier:
    """One device class through its looks."""

    dc: DeviceClass
    specs: list[RunSpec]
    setting: EarlyStop
    confidence: float                   # the policy's, for this class
    ranges: list[tuple[int, int]]       # its chunks
    plan: list[Look]
    chunks: dict[str, list[Path]] = field(default_factory=dict)     # role -> its ok chunk folders, in order
    failed: dict[str, Path] = field(default_factory=dict)           # role -> the chunk run that failed
    decided: GateRun | None = None
    look: int = 0                       # the look it was decided at (1-based)


def gate_early(specs: list[RunSpec], data: EvalData, intakes: dict[str, Intake], device_classes: list[DeviceClass],
               policy: Policy, early: dict[str, EarlyStop], seams: Seams, *, metrics, labels_known: bool = True,
               root: Path | None = None, registry=None, max_parallel: int = 2, progress: Progress | None = None,
               shards: int | None = None, describe: Describing | None = None) -> GateRun:
    """Run and decide in looks: a class with early stop on splits the samples into `looks` chunks; after chunk k
    its runs of chunks 1..k are merged (merge_shards) into prefix folders and judged on the first m_k samples
    (decide_saved, at the look's confidence, tiergate.stats.look_plan). A class stops at the first look whose
    verdict is settled (tiergate.gate.settled), or at its last; only classes still undecided run the next chunk.
    A class with early stop off runs all samples at once (one look at the policy's confidence). Every chunk is an
    ordinary run (its own content-hashed .npz, cached by the run cache); every look's decision is cached."""
    root = root or runs_root()
    n = data.n_samples
    custom = any(getattr(m, "kind", "") == "custom" for m in metrics or ())
    tiers: dict[str, _Tier] = {}
    for dc in device_classes:
        setting, t = early[dc.name], policy.for_target(dc)
        ranges = shard_ranges(n, setting.looks if setting.enabled else 1)
        resamples = min(t.bootstrap_resamples, CUSTOM_MAX_RESAMPLES) if custom else t.bootstrap_resamples
        plan = look_plan([b for _, b in ranges], t.confidence, setting.spending, resamples)
        tiers[dc.name] = _Tier(dc, [s for s in specs if s.device_class.name == dc.name], setting, t.confidence,
                               ranges, plan)
    chunk_data: dict[tuple[int, int], EvalData] = {}
    hits = started = 0
    for k in range(max(len(t.ranges) for t in tiers.values())):
        active = [t for t in tiers.values() if t.decided is None and k < len(t.ranges)]
        if not active:
            break
        datas = {}
        for t in active:
            span = t.ranges[k]
            if span not in chunk_data:
                chunk_data[span] = subset(data, *span)
            datas[t.dc.name] = chunk_data[span]
        todo = [s for t in active for s in t.specs if s.role not in t.failed]
        kw = dict(root=root, registry=registry, max_parallel=max_parallel, progress=progress, shards=shards,
                  describe=describe)
        todo, done = _run_checking_labels(todo, datas, data, seams, labels_known or k > 0, **kw)
        hits += sum(d.cached for d in done)
        started += sum(d.started for d in done)
        for spec, d in zip(todo, done):
            t = tiers[spec.device_class.name]
            if results.load(d.folder).ok:
                t.chunks.setdefault(spec.role, []).append(d.folder)
            else:
                t.failed[spec.role] = d.folder
        for t in active:
            look = t.plan[k]
            forced = "candidate" in t.failed or "reference" in t.failed     # a failed run is settled at any look
            last = k == len(t.ranges) - 1
            if not (look.taken or forced or last):
                continue
            judged = _judge_look(t, k, data, intakes, policy, metrics, root)
            verdict = settled(judged.decision.checks)
            if verdict is not None or forced or last:
                t.decided, t.look = judged, k + 1
                if len(t.ranges) > 1:
                    _say(progress, f"{t.dc.name}: {verdict or verdict_of(judged.decision.checks)} at look {k + 1} "
                                   f"of {len(t.ranges)} ({look.samples} of {n} samples)")
    return _early_decision(tiers, intakes, policy, n, hits, started)


def _judge_look(t: _Tier, k: int, data: EvalData, intakes: dict[str, Intake], policy: Policy, metrics,
                root: Path) -> GateRun:
    """One class's decision on its first m_k samples (at the look's confidence), from prefix folders."""
    look = t.plan[k]
    folders = {(s.role, t.dc.name): t.failed.get(s.role) or _prefix_folder(t.chunks[s.role], t.ranges[:k + 1], root)
               for s in t.specs}
    confidence = look.confidence if look.taken else t.confidence
    extra = {"early_stop": {"look": k + 1, "looks": len(t.ranges), "spending": t.setting.spending,
                            "samples": look.samples, "confidence": confidence}}
    return decide_saved(folders, intakes, [t.dc], _at_confidence(policy, confidence), _prefix_data(data, look.samples),
                        metrics=metrics, extra_inputs=extra)


def _early_decision(tiers: dict[str, _Tier], intakes: dict[str, Intake], policy: Policy, n: int, hits: int,
                    started: int) -> GateRun:
    """The gate's decision from each class's own (decided at its look), cached as one decision naming them."""
    folders = {key: folder for t in tiers.values() for key, folder in t.decided.run_dirs.items()}
    outcomes = load_outcomes(folders)
    looks = {}
    for name, t in tiers.items():
        look = t.plan[t.look - 1]
        looks[name] = TierLooks(verdict_of(t.decided.decision.checks), t.look, len(t.ranges), look.samples, n,
                                t.look < len(t.ranges), t.setting.spending,
                                look.confidence if look.taken else t.confidence, list(t.plan))
    named = dict(folders)       # the chunk runs too: what a re-run reuses (and tiergate gc keeps)
    for t in tiers.values():
        for role, parts in t.chunks.items():
            named.update({(role, f"{t.dc.name}/chunk-{i}"): part for i, part in enumerate(parts, 1)})
        named.update({(role, f"{t.dc.name}/failed-chunk"): part for role, part in t.failed.items()})
    runs, images = {}, {}
    for (role, where), folder in sorted(named.items()):
        raw = (folder / results.RESULT_FILE).read_bytes()
        runs[f"{role}/{where}"] = f"{folder.name}:{hashlib.sha256(raw).hexdigest()}"
        images[f"{role}/{where}"] = json.loads(raw).get("image_id", "")
    inputs = {"candidate": intakes["candidate"].sha256,
              "early_stop": {name: t.to_json() for name, t in looks.items()},
              "tiers": {name: t.decided.decision_key for name, t in tiers.items()},
              "runs": runs, "images": images, "code": _deciding_code_hash()}
    key = decision_key_of(inputs)
    decision = cached_decision(key, inputs)
    cached = decision is not None
    if decision is None:
        common = min(t.samples_used for t in looks.values())
        drift = {side: cross_tier_drift(_first_samples(outcomes.get(side, {}), common))
                 for side in ("candidate", "reference")}
        on_inconclusive = {policy.for_target(t.dc).on_inconclusive for t in tiers.values()}
        decision = combine_tiers({name: t.decided.decision for name, t in tiers.items()}, looks, drift, policy,
                                 on_inconclusive, EARLY_METHOD)
        if len(tiers) > 1 and common < max(t.samples_used for t in looks.values()):
            decision.notes.append(f"cross-tier drift compared on the first {common} samples (those every "
                                  "device class used)")
        save_decision(key, inputs, decision)
    return GateRun(decision, intakes, outcomes, folders, hits, started, decision_cached=cached, decision_key=key)


def _at_confidence(policy: Policy, confidence: float) -> Policy:
    """The policy with every interval at `confidence` (for one look of one device class)."""
    overrides = {name: {k: v for k, v in table.items() if k != "confidence"}
                 for name, table in policy.overrides.items()}
    return dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, confidence=confidence),
                               overrides=overrides)


def _prefix_data(data: EvalData, m: int) -> EvalData:
    """The first m samples as the decision sees them: their labels, and an identity of their own."""
    if m == data.n_samples:
        return data
    return dataclasses.replace(data, sha256=hashlib.sha256(f"{data.sha256}[0:{m}]".encode()).hexdigest(),
                               n_samples=m, labels=None if data.labels is None else data.labels[:m])


def _prefix_folder(parts: list[Path], spans: list[tuple[int, int]], root: Path) -> Path:
    """One artifact's run on the first chunks: their folders merged in sample order (itself for one chunk),
    named by the chunks' run keys, reused while it verifies."""
    if len(parts) == 1:
        return parts[0]
    key = hashlib.sha256(("prefix\0" + "\0".join(p.name for p in parts)).encode()).hexdigest()[:24]
    folder = root / key
    with key_lock(key):
        if not verified(folder, quiet=True):
            work = folder.with_name(f"{key}.part-{os.getpid()}-{threading.get_ident()}")
            shutil.rmtree(work, ignore_errors=True)
            try:
                merge_shards(parts, work, spans)
                _replace_dir(work, folder)
            except OSError as exc:
                shutil.rmtree(work, ignore_errors=True)
                if is_disk_full(exc):
                    raise disk_full(exc, root) from None
                raise
    return folder


def _first_samples(outcomes: dict[str, RunOutcome], m: int) -> dict[str, RunOutcome]:
    """The outcomes cut to their first m samples (outputs have the sample axis first, as merged shards)."""
    return {name: o if not o.ok else RunOutcome(o.result, {k: v[:m] for k, v in o.outputs.items()})
            for name, o in outcomes.items()}



class Describing:
    """Each tier's candidate described once (describe_candidate), in the tier's run step and within the run
    slots: a tier's runtime graph is made while other tiers run (an emulated tier's describe, seconds under QEMU,
    beside a native tier's runs), never more containers at once than --max-parallel. `done`: class -> result."""

    def __init__(self, builder: Builder, progress: Progress | None = None):
        self.builder, self.progress = builder, progress
        self.done: dict[str, Any] = {}
        self._guard = threading.Lock()

    def __call__(self, group: list[RunSpec], slots=None) -> None:
        name = group[0].device_class.name
        with self._guard:
            if name in self.done or not any(s.role == "candidate" for s in group):
                return
            self.done[name] = None                      # claimed: described once, whoever asks again
        try:
            with slots if slots is not None else _no_slot():
                self.done[name] = describe_candidate(group, self.builder, progress=self.progress)
        except BaseException:
            with self._guard:
                del self.done[name]                     # a retried step describes it again
            raise


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
                 cache_hits: int = 0, started: int = 0, metrics=None, extra_inputs: dict | None = None) -> GateRun:
    """The decision from saved run folders: from the decision cache when every input it names matches.
    `extra_inputs`: more that the decision's identity includes (an early decision's look)."""
    outcomes = load_outcomes(folders)
    metrics = metrics if metrics is not None else resolve_metrics(None, policy)
    inputs = decision_inputs(folders, intakes, device_classes, policy, data, metrics) | (extra_inputs or {})
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
