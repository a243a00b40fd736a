"""Running specs: cached by input identity, one run per key at a time, every tier at once.

A run's folder is named by its run key (state.run_key over the artifact, the class and how it evaluates, the
image and the data), written whole under the key's lock (two gates of one input share one run) and reused while
it verifies (its outputs still hash to what its result says). What must run runs in PendingRuns (spans.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
import threading
from contextlib import ExitStack
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tiergate import results, state
from tiergate.errors import TiergateError, disk_full, is_disk_full
from tiergate.evaldata import EvalData
from tiergate.execution import counting, janitor
from tiergate.execution.cancel import Cancelled
from tiergate.orchestrator.intake import check_labels_after
from tiergate.orchestrator.seams import Seams
from tiergate.orchestrator.spans import PendingRuns, RunSlots
from tiergate.orchestrator.types import RunDone, RunSpec, say
from tiergate.request import RunOptions
from tiergate.stats import import_in_background


# What a device class holds that cannot change a run's result: left out of the run key (everything else is in it,
# so a new field is in the key by default). The shard count never changes a result (shards merge in sample order),
# nor does the number of batched calls made at once (each call is the class's, whichever thread makes it).
_NOT_IN_RUN_KEY = ("cost_per_hour", "description", "cost_tags", "source")
_EVALUATION_NOT_IN_RUN_KEY = ("shards", "shard_samples", "workers")


def class_settings(dc) -> str:
    """A hash of a device class's whole effective settings that can change a run: limits (memory, pids, timeout),
    threads, batch size, evaluation, runtime and version, build, engine, CPU (the class's and the one it runs on)."""
    settings = {k: v for k, v in dataclasses.asdict(dc).items() if k not in _NOT_IN_RUN_KEY}
    settings["evaluation"] = {k: v for k, v in settings["evaluation"].items() if k not in _EVALUATION_NOT_IN_RUN_KEY}
    settings["cpu_key"] = dc.cpu_key
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def spec_key(spec: RunSpec, data: EvalData) -> str:
    """The run key of a spec: what it runs, where (the class's whole settings: class_settings), in which image,
    on which data, profiled or not."""
    dc = spec.device_class
    how = f"+settings-{class_settings(dc)}" + ("+profile" if spec.profile else "")
    how += "".join(f"+paired-{p.sha256}" for p in spec.partners)     # its calls timed beside theirs
    # a counted run is another run (its instructions recorded): counted where asked for (RunSpec.count)
    count = counting.counts(dc, dc.docker_host) if spec.count else None
    how += f"+count-{count.key}" if count is not None else ""
    return state.run_key(spec.intake.sha256, dc.name + how, spec.image.image_id, data.sha256)


def run_one(spec: RunSpec, data: EvalData, backend, options: RunOptions | None = None) -> RunDone:
    """Run one spec (a tier of one artifact; see run_tier)."""
    return run_tier([spec], data, backend, options or RunOptions())[0]


def run_tier(specs: list[RunSpec], data: EvalData, backend, options: RunOptions, slots=None,
             describe: bool = False, cancel=None) -> list[RunDone]:
    """Run the specs of one device class, reusing each verified saved (or recorded) result; a RunDone each.

    What must run runs together: the pending artifacts (candidate, reference, incumbent) in one harness
    start per shard (`backend.run_many`), each shard a range of the samples (`options.shards`, else the class's
    `[evaluation] shards`), in parallel within `slots`. Each artifact's run is still saved (and cached) on
    its own, under its run key. Never two runs of one key at once. A failed run whose backend then reports its
    engine gone raises InfrastructureFault: never a verdict. `describe`: a candidate run that starts also
    describes its runtime graph in its last span (describing.Describing reads it from the run's folder).
    `cancel` (execution.cancel.Cancel): set when the gate no longer needs these runs; a run it cut short raises
    Cancelled, and what finished before is kept.
    """
    dc = specs[0].device_class
    root = options.root or state.runs_root()
    done: dict[int, RunDone] = {}
    keyed: list[tuple[int, RunSpec, str]] = []
    for i, spec in enumerate(specs):
        if spec.image is None:
            folder = root / state.run_key(spec.intake.sha256, dc.name, "no-image", data.sha256)
            with state.writing_folder(folder) as work:
                results.save(results.failed(dc.name, spec.build_error or "no image", tier=dc.tier,
                                            artifact_sha256=spec.intake.sha256), work)
            done[i] = RunDone(spec.role, dc.name, folder, cached=False, started=False)
        else:
            keyed.append((i, spec, spec_key(spec, data)))
    caches = getattr(backend, "caches_locally", True)
    janitor.check_stop()
    with ExitStack() as locks:
        for key in sorted({key for _, _, key in keyed}):     # one order everywhere: no deadlock between gates
            locks.enter_context(state.key_lock(key))
        pending: dict[str, RunSpec] = {}
        for i, spec, key in keyed:
            if key in pending:                  # the same artifact in two roles (a model against itself)
                continue
            if caches and (state.verified(root / key)
                           or (not spec.profile and _fetch_recorded(options.registry, spec, data, root / key))):
                say(options.progress, f"cached: {spec.role} on {dc.name}")
                done[i] = RunDone(spec.role, dc.name, root / key, cached=True, started=False)
            else:
                pending[key] = spec
        started = PendingRuns(pending, data, backend, options, slots, describe, cancel).run() if pending else {}
        for key, ran in started.items():
            if ran:
                _stamp_key(root / key, key)
        for i, spec, key in keyed:
            if i not in done:
                first = started.get(key) is not None and pending[key].role == spec.role
                ran = first and bool(started[key])
                done[i] = RunDone(spec.role, dc.name, root / key, cached=not ran, started=ran)
    return [done[i] for i in range(len(specs))]


def _stamp_key(folder: Path, key: str) -> None:
    """Name the run key (the class's whole settings included) in a fresh run's result.json: a run recorded in a
    registry is reused (_fetch_recorded) only for the same key, never for the same class name under other limits."""
    if (folder / state.RESULT_FILE).is_file():
        result = results.load(folder)
        if result.extra.get("run_key") != key:
            result.extra["run_key"] = key
            results.save(result, folder)
            state.seal_run(folder, folder)         # its result.json changed: sealed again


def _fetch_recorded(registry, spec: RunSpec, data: EvalData, folder: Path) -> bool:
    """A result recorded in a (possibly shared) registry for exactly this input: its run key (stamped in its
    result.json) must be this one, so a run made under other class settings is never fetched."""
    if registry is None:
        return False
    run = registry.find_cached_run(spec.intake.sha256, spec.device_class.name, spec.image.image_id, data.sha256)
    if run is None or not run.result_key:
        return False
    work = state.part_path(folder)
    try:
        registry.fetch_result(run, work)
    except (TiergateError, OSError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise disk_full(exc, work.parent) from None
        text = exc.one_line() if isinstance(exc, TiergateError) else " ".join(str(exc).split())[:300]
        print(f"tiergate: warning: the recorded run {run.id} cannot be fetched ({text}); running it again",
              file=sys.stderr)
        return False
    recorded = (state.read_result(work) or {}).get("extra") or {}
    if recorded.get("run_key") != folder.name:
        shutil.rmtree(work, ignore_errors=True)
        return False
    state.replace_dir(work, folder)
    return state.verified(folder)


@dataclass
class Running:
    """How a gate's runs are done: its seams, its run options, and the tiers' describer (describing.py), which
    describes each tier's candidate in the tier's run step: in the candidate's own run where it can."""

    seams: Seams
    options: RunOptions
    describe: object = None
    # an early decision's: device class name -> its execution.cancel.Cancel (set: its runs stop, run_specs gives
    # None for them), and what is called with each class's RunDones as soon as its runs end (it may set others)
    cancels: dict = field(default_factory=dict)
    on_tier_done: Callable | None = None
    bootstraps: bool = True     # the decision bootstraps (deciding.bootstraps): scipy.stats loads while tiers run
    labels: "LabelCheck | None" = None      # labels whose class count only the reference's outputs say


def run_specs(specs: list[RunSpec], data: EvalData | dict[str, EvalData], how: Running) -> list[RunDone]:
    """Run every spec (verified saved results are reused): one step per device class (run_tier), every tier at
    once, at most `max_parallel` containers (or processes) running at a time; RunDones in the specs' order (None
    for a spec whose class was stopped: Running.cancels). `data`: the samples of every tier, or per device class
    name (an early decision's chunks)."""
    tiers: dict[str, list[RunSpec]] = {}
    for spec in specs:
        tiers.setdefault(spec.device_class.name, []).append(spec)
    slots = RunSlots(how.options.max_parallel)

    def one(group: list[RunSpec]) -> list[RunDone | None]:
        name = group[0].device_class.name
        describing = how.describe is not None and how.describe.claim(group)
        tier_data = data if isinstance(data, EvalData) else data[name]
        try:
            done = run_tier(group, tier_data, how.seams.backend_for(group[0].device_class), how.options, slots,
                            describe=describing, cancel=how.cancels.get(name))
            # the decision's statistics load while the other tiers still run (not while containers start)
            import_in_background(how.bootstraps)
            if how.labels is not None:          # before anything is judged on them
                how.labels.after(group, done, how.cancels)
            if how.on_tier_done is not None:    # judged before a describe of its own waits for a slot
                how.on_tier_done(group, done)
            if describing:
                how.describe.after_runs(group, done, slots)
        except Cancelled:
            if describing:
                how.describe.release(group)
            return [None] * len(group)
        except BaseException:
            if describing:
                how.describe.release(group)
            raise
        return done

    groups = list(tiers.values())
    ran = how.seams.steps.map("run", one, groups, limit=len(groups), name=lambda g: g[0].device_class.name)
    by_spec = {id(spec): done for group, dones in zip(groups, ran) for spec, done in zip(group, dones)}
    return [by_spec[id(spec)] for spec in specs]


class LabelCheck:
    """Class-index labels of a model whose output shape does not say its class count (a dynamic output): checked
    once, against the first reference run that ends on any class, before anything is judged. Every class runs at
    once meanwhile (the native tier's reference ends in seconds, so a wrong label is still refused in seconds), and
    refused labels stop every class's runs (its Cancel) before the error is raised."""

    def __init__(self, data: EvalData):
        self.data, self.checked, self.lock = data, False, threading.Lock()

    def after(self, group: list[RunSpec], done: list, cancels: dict) -> None:
        if self.checked:
            return
        folder = next((d.folder for s, d in zip(group, done) if s.role == "reference" and d is not None), None)
        if folder is None or not results.load(folder).ok:
            return                      # no outputs to count classes on: the next class's reference checks them
        with self.lock:
            if self.checked:
                return
            try:
                check_labels_after(self.data, folder)
            except TiergateError as exc:
                for cancel in cancels.values():
                    cancel.set(f"the labels are refused: {exc.one_line()}")
                raise
            self.checked = True


def load_outcomes(folders: dict[tuple[str, str], Path]):
    from tiergate.gate import RunOutcome

    outcomes: dict[str, dict[str, RunOutcome]] = {}
    for (role, dc_name), folder in folders.items():
        outcomes.setdefault(role, {})[dc_name] = RunOutcome.load(folder)
    return outcomes
