"""Running the pending runs of one tier: one harness start per span of the samples (a shard), every artifact's
result put in place as soon as it is finished, shards merged in sample order.

`PendingRuns(pending, data, backend, options, slots).run()` is called with the pending keys' locks held
(running.run_tier); every key's folder is in place when it returns. A span is one `execute_group` of the tier's
pending artifacts (candidate, reference, incumbent): one container start, each artifact in its own process. A
finished artifact is put in place at once (Job.on_done), so a stop, a later artifact's failure or a killed gate
keeps what is measured; a finished shard is kept under runs/<key>.shards/ until every shard of its artifact is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from pathlib import Path

import numpy as np

from tiergate import results, state
from tiergate.errors import EnvironmentProblem, InfrastructureFault, TiergateError, disk_full, is_disk_full
from tiergate.evaldata import EvalData, dynamic_dim
from tiergate.execution import janitor
from tiergate.execution.cancel import Cancel, Cancelled
from tiergate.harness_source import calls_at_once
from tiergate.hashing import file_sha256
from tiergate.orchestrator.types import RunSpec, say
from tiergate.runtime_graph import described_files
from tiergate.request import RunOptions

Span = tuple[int, int]


def shard_ranges(n: int, count: int) -> list[Span]:
    """`count` consecutive ranges of n samples, as even as can be."""
    count = max(1, min(count, n))
    edges = [round(i * n / count) for i in range(count + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:])]


def sample_order(keys: np.ndarray, labels: np.ndarray | None, seed: int) -> np.ndarray:
    """The file positions of every sample in an early decision's order: a seeded random order (by the samples'
    keys, evaldata.sample_keys), stratified where the labels are one class index per sample: each class is
    shuffled by its keys and the classes are interleaved by fractional position ((rank + phase) / class size, the
    phase seeded per class), so every prefix holds each class in about its share of the whole set. Made from the
    seed and the samples only: reordering the file reorders nothing here."""
    n = len(keys)
    strata = labels is not None and labels.ndim == 1 and len(labels) == n and (
        np.issubdtype(labels.dtype, np.integer) or labels.dtype == np.bool_)
    if not strata:
        return np.lexsort((keys[:, 1], keys[:, 0]))
    position = np.empty(n, dtype=np.float64)
    for value in np.unique(labels):
        members = np.flatnonzero(labels == value)
        members = members[np.lexsort((keys[members, 1], keys[members, 0]))]
        phase = int.from_bytes(hashlib.blake2b(f"{int(seed)}\0{int(value)}".encode(), digest_size=8).digest(),
                               "little") / 2 ** 64
        position[members] = (np.arange(len(members)) + phase) / len(members)
    return np.lexsort((keys[:, 1], keys[:, 0], position))


def partition(order: np.ndarray, count: int) -> tuple[list[Span], list[np.ndarray]]:
    """`count` chunks of an order (early decision): their spans of positions in it and their samples' file
    positions (the whole set in one chunk: in file order, the data itself)."""
    spans = shard_ranges(len(order), count)
    if len(spans) == 1:
        return spans, [np.arange(len(order))]
    return spans, [order[a:b] for a, b in spans]


class PendingRuns:
    """The pending keys of one tier, run over shards of the samples; `run()` -> key -> whether a run started
    (False: the backend's far side reused a recorded run), None for a key with nothing left to run."""

    def __init__(self, pending: dict[str, RunSpec], data: EvalData, backend, options: RunOptions, slots=None,
                 describe: bool = False, cancel: Cancel | None = None):
        self.pending, self.data, self.options, self.slots = pending, data, options, slots
        self.cancel = cancel                # set when the gate no longer needs these runs (execution.cancel)
        self.describe = describe            # the candidate's last span also describes its runtime graph
        self.backend = _HostFaults(backend)
        self.raw_backend = backend
        self.root = options.root or state.runs_root()
        self.dc = next(iter(pending.values())).device_class
        ev = self.dc.evaluation
        # a tier whose batched calls can run at once in one container runs there on `workers` threads, not shards
        self.workers = spread_workers(self.dc, pending.values(), data, backend, options.shards)
        # an emulated tier on a work pool: one share of its samples per worker online (a native tier's timed calls
        # stay on one machine)
        shares = getattr(backend, "share_count", None) if self.dc.emulated else None
        count = 1 if self.workers > 1 else (
            shares(data.n_samples, options.shards or ev.shards, ev.shard_samples) if shares is not None else
            ev.shard_count(self.dc, data.n_samples, options.shards) if getattr(backend, "takes_samples", False) else 1)
        if not getattr(backend, "takes_slots", True):      # its runs use another machine's cores
            self.slots = None
        self.ranges = shard_ranges(data.n_samples, count)
        self.sharded = len(self.ranges) > 1
        self.tag = state.part_tag()            # one writer: the spans' threads write under the tier's tag
        self.works = {key: state.part_path(self.root / key, self.tag) for key in pending}
        order = costliest_first(list(pending), pending) if self.workers > 1 and self.dc.emulated else list(pending)
        todo = [(span, [key for key in order
                        if not (self.sharded and state.verified(self.shard(key, span), quiet=True))])
                for span in self.ranges]
        self.todo = [(span, keys) for span, keys in todo if keys]
        self.placed: set[tuple[str, Span]] = set()      # put in place as soon as the harness finished it
        self.guard = threading.Lock()

    def latency_calls(self, span: Span) -> int:
        """Calls a shard times: a native class's spread over its shards, at least 4 each (its percentiles); an
        emulated class's (never gated) all in its first shard, the others none (their cold first call checks
        their batched outputs)."""
        ev = self.dc.evaluation
        if self.dc.emulated:
            return ev.latency_calls if span == self.ranges[0] else 0
        return max(-(-ev.latency_calls // len(self.ranges)), min(4, ev.latency_calls))

    def shard(self, key: str, span: Span) -> Path:
        return state.shard_folder(self.root, key, span)

    def run(self) -> dict[str, bool | None]:
        try:
            outcome = _map_threads(self.run_span, self.todo)
            return self.settle(outcome)
        except BaseException as exc:
            self.keep_what_finished(exc)
            raise

    # -- one span: one harness start ---------------------------------------------------------------
    def out_dir(self, key: str, span: Span) -> Path:
        return self.works[key] if not self.sharded else state.part_path(self.shard(key, span), self.tag)

    def run_span(self, item: tuple[Span, list[str]]) -> list[results.TargetResult]:
        from tiergate.execution.run import execute_group

        span, keys = item
        for key in keys:
            shutil.rmtree(self.out_dir(key, span), ignore_errors=True)
        roles = ", ".join(self.pending[key].role for key in keys)
        where = f" samples {span[0]}-{span[1]}" if self.sharded else ""
        # a backend that says when its harness starts and ends holds the run slot for that alone: its container
        # is made and filled before (while another runs), and read back and removed after
        hooks = getattr(self.raw_backend, "takes_slot_hooks", False)
        slot = _Slot(self.slots, lambda: say(self.options.progress, f"running {roles} on {self.dc.name}{where}"))
        try:
            if hooks:
                slot.ahead()            # the backend takes the slot itself (Job.on_start)
            else:
                slot.take()
            janitor.check_stop()
            if self.cancel is not None:
                self.cancel.check()
            jobs = [self.job(key, span, slot if hooks else None) for key in keys]
            ran = execute_group(jobs, self.backend)
        finally:
            slot.give()
        janitor.check_stop()               # a run cut short by a stop is no result: only what finished is kept
        if self.cancel is not None and self.cancel.is_set() and not all(r.ok for r in ran):
            raise Cancelled(self.cancel.reason)     # likewise a run the gate stopped: what finished is in place
        self.backend.raise_fault()
        for key, job, result in zip(keys, jobs, ran):
            if (key, span) not in self.placed:
                self.save_span(key, span, job.out_dir, result)
        return ran

    def job(self, key: str, span: Span, slot: "_Slot | None" = None):
        from tiergate.execution.base import Job

        spec, out = self.pending[key], self.out_dir(key, span)
        stamp = {"started_at": state.now_iso(), "t0": time.monotonic()}
        first = span == self.ranges[0]                  # a run's timed, counted and interleaved calls go there
        spreading = self.workers > 1 and slot is not None and slot.slots is not None    # slots granted as they free
        # the spec's own class: the tier's, or the candidate's with its passes switched off (--disable-pass)
        return Job(spec.device_class, self.data.path, out, image=spec.image, artifact_path=spec.intake.artifact.path,
                   artifact_sha256=spec.intake.sha256, data_sha256=self.data.sha256, role=spec.role,
                   profile=spec.profile, samples=span if self.sharded else None,
                   eval_batch=self.dc.evaluation.batch, latency_calls=self.latency_calls(span),
                   eval_workers=self.workers,
                   # with run slots, one at the start and each further one as it comes free (Job.on_running);
                   # without (no limit), every call slot from the start
                   eval_slots=1 if spreading else 0,
                   # asked for, instructions are counted in the first shard (exact: its are the run's, merge_shards)
                   count=first and spec.count,
                   warmup=self.dc.evaluation.warmup,
                   # the describe in the last shard: the first carries the timed (and counted) calls
                   describe=self.describe and spec.role == "candidate" and span == self.ranges[-1],
                   pair_with=tuple(p.artifact.path for p in spec.partners) if first else (),
                   pairs=spec.pairs if first else 0,
                   pair_sha256=tuple(p.sha256 for p in spec.partners) if first else (), cancel=self.cancel,
                   on_start=slot.take if slot is not None else None,
                   on_exited=slot.give if slot is not None else None,
                   on_running=(lambda grant: slot.more(self.workers - 1, grant)) if spreading else None,
                   on_done=lambda result: self.place(key, span, out, stamp))

    def place(self, key: str, span: Span, out: Path, stamp: dict) -> None:
        """Job.on_done: an artifact the backend read back while the others still run goes in place at once."""
        fields = {"started_at": stamp["started_at"], "wall_s": round(time.monotonic() - stamp["t0"], 3)}
        if keep_finished(out, self.shard(key, span) if self.sharded else self.root / key, fields):
            with self.guard:
                self.placed.add((key, span))
            if not self.sharded:
                janitor.note_finished()

    def save_span(self, key: str, span: Span, out: Path, result: results.TargetResult) -> None:
        if result.ok:
            result.outputs_sha256 = file_sha256(out / state.OUTPUTS_FILE)
            results.save(result, out)
            if self.sharded:                # a finished shard is kept, whatever happens to the others
                out.parent.mkdir(parents=True, exist_ok=True)
                state.replace_dir(out, self.shard(key, span))
        elif self.sharded:                  # the failure is reported with the artifact's run
            shutil.rmtree(out, ignore_errors=True)

    # -- after every span -----------------------------------------------------------------------------
    def settle(self, outcome: list[list[results.TargetResult]]) -> dict[str, bool | None]:
        failures: dict[str, tuple[Span, results.TargetResult]] = {}
        for (span, keys), ran in zip(self.todo, outcome):
            for key, result in zip(keys, ran):
                check_cpu(self.dc, result)
                if not result.ok:
                    failures.setdefault(key, (span, result))
        if failures:
            probe = getattr(self.raw_backend, "engine_problem", None)
            problem = probe() if probe is not None else None
            if problem:
                raise InfrastructureFault(f"on {self.dc.name}: the run failed and the engine is gone: {problem}")
        started: dict[str, bool | None] = {}
        for key in self.pending:
            self.settle_key(key, failures.get(key))
            ran_any = any(key in keys for _, keys in self.todo)
            started[key] = (not results.load(self.root / key).extra.get("reused")) if ran_any else None
        return started

    def settle_key(self, key: str, failure: tuple[Span, results.TargetResult] | None) -> None:
        work = self.works[key]
        if failure is not None:
            span, result = failure
            if self.sharded:
                result.reason = (f"shard {self.ranges.index(span) + 1} of {len(self.ranges)} "
                                 f"(samples {span[0]}-{span[1]}): {result.reason}")
                result.extra = {**result.extra, "shards_kept": [f"{a}-{b}" for a, b in self.ranges
                                                                if state.verified(self.shard(key, (a, b)),
                                                                                  quiet=True)]}
            shutil.rmtree(work, ignore_errors=True)
            results.save(result, work)
        elif self.sharded:
            merge_shards([self.shard(key, span) for span in self.ranges], work)
        if failure is not None or (key, self.ranges[0]) not in self.placed or self.sharded:
            state.replace_dir(work, self.root / key)
            janitor.note_finished()
        if self.sharded and failure is None:
            shutil.rmtree(state.shards_of(self.root, key), ignore_errors=True)

    def keep_what_finished(self, exc: BaseException) -> None:
        """An interrupted start keeps what it finished (and verifies it); everything partial goes."""
        disk = isinstance(exc, OSError) and is_disk_full(exc)
        for key, work in self.works.items():
            if not disk and keep_finished(work, self.root / key):
                janitor.note_finished()
        for span, keys in self.todo:
            for key in keys:
                part = state.part_path(self.shard(key, span), self.tag)
                if disk or not keep_finished(part, self.shard(key, span)):
                    shutil.rmtree(part, ignore_errors=True)
        for key, work in self.works.items():
            shutil.rmtree(work, ignore_errors=True)
            try:
                state.shards_of(self.root, key).rmdir()     # nothing kept there: no empty folder left
            except OSError:
                pass
        if disk:
            raise disk_full(exc, self.root) from None


def costliest_first(keys: list[str], pending: dict[str, RunSpec]) -> list[str]:
    """The order of an emulated tier's artifacts run one after another in one start with calls at once: the
    costliest first (the largest file, an FP32 before its INT8; on a tie the specs' order). Its single-threaded start
    (load, cold and timed single calls: seconds a call under QEMU) then runs beside the native tiers' runs at the
    gate's start, and the next artifact's shorter one beside its last batched calls (the other order left a core
    idle there for the FP32's start)."""
    def size(key: str) -> int:
        try:
            return Path(pending[key].intake.artifact.path).stat().st_size
        except (OSError, TypeError):
            return 0
    return sorted(keys, key=lambda key: -size(key))


def spread_workers(dc, specs, data: EvalData, backend, requested_shards: int | None = None) -> int:
    """Batched calls at once in one container of this tier (Evaluation.worker_count), where they can be: a backend
    that gives a running harness more CPUs (`spreads_calls`: the Docker backend), a runtime whose calls may run at
    once in one process (the harness's own list, harness_batched.CALLS_AT_ONCE: harness_source.calls_at_once;
    onnxruntime's CPU session), batched evaluation on, no shard count asked for, and a dynamic batch dimension on
    every sample-carrying input of every artifact (the harness batches those only). Else 1: the samples are sharded
    over containers as before."""
    ev = dc.evaluation
    if not (getattr(backend, "spreads_calls", False) and ev.batch > dc.batch_size and not requested_shards
            and not ev.shards and data.n_samples > 1 and dc.runtime in calls_at_once()):
        return 1
    for spec in specs:
        for tensor in spec.intake.artifact.inputs:
            axis = data.axis(tensor.name) if tensor.name in data.info else 0
            if axis is not None and (axis >= len(tensor.shape) or not dynamic_dim(tensor.shape[axis])):
                return 1
    return ev.worker_count(dc)


def check_cpu(dc, result: results.TargetResult) -> None:
    """A run whose runtime saw a CPU that is not the class's device (its [cpu] table) is no measurement of that
    device: exit 2, naming the difference (an emulated class's emulated_cpu that does not present the device)."""
    features = (result.cpu or {}).get("features")
    if not result.ok or features is None or (result.cpu or {}).get("source") == "none":
        return
    differences = dc.cpu.differences(features)
    if differences:
        raise EnvironmentProblem(f"device class {dc.name}: its runtime saw {result.cpu.get('model', 'a CPU')}, which "
                                 f"{' and '.join(differences)}: the run does not measure the device",
                                 hint="fix the class's emulated_cpu or its [cpu] table")


def keep_finished(work: Path, folder: Path, stamp: dict | None = None) -> bool:
    """Put in place an artifact's run that its backend finished and saved before the whole start ended (the
    harness finished it, the host read it back): a stop or a failure of a later artifact does not lose it."""
    try:
        result = results.load(work)
        if not (result.ok and result.image_id and result.data_sha256 and (work / state.OUTPUTS_FILE).is_file()):
            return False
        for name, value in (stamp or {}).items():
            setattr(result, name, value)
        result.outputs_sha256 = file_sha256(work / state.OUTPUTS_FILE)
        results.save(result, work)
        folder.parent.mkdir(parents=True, exist_ok=True)
        state.replace_dir(work, folder)
        return True
    except (TiergateError, OSError):
        return False


class RunSlots:
    """At most `n` harness starts running at a time (a semaphore: `with slots:` holds one), and, for a backend
    that makes and fills its container before it takes a slot (takes_slot_hooks), at most `n` more made ahead,
    waiting: a run's files are never copied for more starts than that at once."""

    def __init__(self, n: int):
        self.running = threading.BoundedSemaphore(max(1, n))
        self.ahead = threading.BoundedSemaphore(max(1, n))
        # harness starts made ahead and waiting for their first slot: a running harness's further slots (_Slot.more)
        # go to them first (a native tier's start never waits behind an emulated tier's spread calls)
        self.queued = 0
        self.queue_lock = threading.Lock()

    def enqueue(self, step: int) -> None:
        with self.queue_lock:
            self.queued += step

    def acquire(self) -> None:
        self.running.acquire()

    def release(self) -> None:
        self.running.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class _Slot:
    """One harness start's hold on the run slots (RunSlots, or None: no limit), used by the span's own thread
    (the backend's hooks run there): taken at most once at a time, given back at most once per take. `ahead()`
    holds one of RunSlots' made-ahead places from before the container is made until the run slot is taken;
    `more()` takes further slots for a harness that spreads its batched calls, on a thread of its own."""

    def __init__(self, slots: RunSlots | None, on_take=None):
        self.slots, self.on_take, self.held, self.waiting = slots, on_take, False, False
        self.extra, self.extra_lock, self.extra_stop, self.extra_thread = 0, threading.Lock(), None, None

    def more(self, n: int, grant) -> None:
        """Job.on_running: up to `n` further run slots for the running harness, each taken as it comes free (on a
        thread of its own) and handed over with `grant()` (the harness makes one more batched call at once); all
        given back with the first (`give`)."""
        self._give_extra()              # a retried attempt's harness: the earlier one's are its no longer
        if n <= 0 or self.slots is None:
            return
        stop = self.extra_stop = threading.Event()

        def take_more():
            for _ in range(n):
                while True:
                    if stop.is_set():
                        return
                    if self.slots.queued == 0 and self.slots.running.acquire(timeout=0.1):
                        if self.slots.queued == 0:
                            break
                        self.slots.release()        # a start came to wait meanwhile: its first slot goes first
                    time.sleep(0.05)
                with self.extra_lock:
                    if stop.is_set():
                        self.slots.release()
                        return
                    self.extra += 1
                try:
                    grant()
                except Exception:  # noqa: BLE001 - a harness that has ended needs no more; the slot goes back on give
                    return
        self.extra_thread = threading.Thread(target=take_more, name="tiergate-more-slots", daemon=True)
        self.extra_thread.start()

    def ahead(self) -> None:
        if self.slots is not None:
            self.slots.ahead.acquire()
            self.waiting = True
            self.slots.enqueue(1)

    def take(self) -> None:
        if self.held:
            return
        if self.slots is not None:
            self.slots.acquire()
        self.held = True
        self._leave_queue()
        if self.on_take is not None:
            self.on_take()

    def give(self) -> None:
        self._leave_queue()
        self._give_extra()
        if self.held:
            self.held = False
            if self.slots is not None:
                self.slots.release()

    def _give_extra(self) -> None:
        if self.extra_stop is not None:
            self.extra_stop.set()
            with self.extra_lock:
                for _ in range(self.extra):
                    self.slots.release()
                self.extra = 0

    def _leave_queue(self) -> None:
        if self.waiting:
            self.waiting = False
            self.slots.enqueue(-1)
            self.slots.ahead.release()


def _map_threads(fn, items: list) -> list:
    """fn over items on threads, results in order; the first failure raised once all have ended."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="tiergate-shard") as pool:
        futures = [pool.submit(fn, item) for item in items]
        wait_all(futures)
    return [future.result() for future in futures]


class _HostFaults:
    """A backend wrapper that keeps a full disk (ENOSPC), or an environment problem a backend raises (an image gone
    from the engine), from becoming a failed run, hence a verdict: it is raised once the span ends (exit 2)."""

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
        except EnvironmentProblem as exc:   # e.g. the image was removed under the gate (execution.base.ImageGone)
            if not isinstance(exc, InfrastructureFault):
                self.fault = exc
            raise

    def raise_fault(self) -> None:
        if self.fault is not None:
            raise self.fault


# --- merging shards ---------------------------------------------------------------------------------------


def merge_shards(parts: list[Path], work: Path, spans: list[Span] | None = None) -> results.TargetResult:
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
    too_large = results.over_output_limit(work, sum(results.outputs_nbytes(part) for part in parts))
    if too_large:
        result = results.failed(first.device_class, too_large, tier=first.tier,
                                artifact_sha256=first.artifact_sha256)
        results.save(result, work)
        return result
    shards = [{"samples": [int(a), int(b)], "wall_s": r.wall_s, "started_at": r.started_at,
               "latency_calls": len(r.latencies_ns), **({"worker": r.extra["worker"]} if "worker" in r.extra else {})}
              for r, (a, b) in zip(loaded, spans or (map(int, part.name.split("-")) for part in parts))]
    result = dataclasses.replace(
        first, n_samples=sum(r.n_samples for r in loaded), latencies_ns=[x for r in loaded for x in r.latencies_ns],
        started_at=min(r.started_at for r in loaded), wall_s=max(r.wall_s for r in loaded),
        extra={**first.extra, "evaluation": _merged_evaluation(loaded), "shards": shards}, outputs_sha256="")
    results.concat_outputs(parts, work)       # streamed: one shard's array in memory at a time
    described = next((part for part in parts if described_files(part)), None)
    for path in described_files(described) if described is not None else ():   # the shard that described it
        shutil.copyfile(path, work / path.name)
    result.outputs_sha256 = file_sha256(work / state.OUTPUTS_FILE)
    results.save(result, work)
    return result


def _merged_evaluation(loaded: list[results.TargetResult]) -> dict:
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
    return evaluation
