"""The one interface every backend implements, and what all of them share.

A `Job` is one artifact + one evaluation set (or a range of its samples, a shard)
on one device class. A backend's `run(job)` runs the harness, leaves the harness's
outputs.npz in `job.out_dir` and returns a `TargetResult` (never raises for a failed
run: a crash, an out-of-memory kill or a timeout is a failed result with a reason
and a log tail). A backend may also have `run_many(jobs)`: several artifacts on the
same class and samples in ONE harness start (one container, one import, one data
load), a result per job; `run_group` uses it where there is one.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from tiergate.errors import EnvironmentProblem, InputError
from tiergate.execution.cancel import Cancel
from tiergate.hashing import file_sha256
from tiergate.images import LABEL, BuiltImage
from tiergate.results import OUTPUTS_FILE, RESULT_FILE, TargetResult, failed, over_output_limit
from tiergate.targets import DEFAULT_WARMUP  # noqa: F401 - the one home of the default; run.py imports it here
from tiergate.targets import DeviceClass

LOG_TAIL_LINES = 40


class ImageGone(EnvironmentProblem):
    """A job's image is not on the engine any more (removed while the gate ran): the environment's fault, exit 2,
    never a failed run (hence never a verdict). Backends raise it; the orchestrator lets it through."""

# fields of TargetResult the harness itself knows (the host adds the rest)
HARNESS_FIELDS = ("runtime", "versions", "machine", "cpu", "threads", "batch_size", "n_samples",
                  "latencies_ns", "warmup", "extra", "device")


@dataclass(frozen=True)
class Job:
    """One run: an artifact (in `image`, or at `artifact_path` for the local process backend)."""

    device_class: DeviceClass
    data_npz: Path
    out_dir: Path
    image: BuiltImage | None = None
    artifact_path: Path | None = None
    artifact_sha256: str = ""
    data_sha256: str = ""                               # known by the caller: saves hashing the data per run
    warmup: int = DEFAULT_WARMUP
    env: dict[str, str] = field(default_factory=dict)  # extra environment (TIERGATE_HARNESS_FAULT in tests)
    compare_rounds: int = 0                             # harness vs bare loop rounds (bench/bench_harness.py)
    role: str = ""                                      # candidate / reference / incumbent (for remote runs, logs)
    profile: bool = False                               # per-op time in device.op_profile (harness --profile)
    samples: tuple[int, int] | None = None              # [start, stop) of the data (a shard); None: all
    eval_batch: int = 0                                 # samples per call for outputs (0: the class's batch size)
    latency_calls: int = 1                              # with eval_batch: calls timed for latency (0: none, the
                                                        # cold first call only checks batching: a later shard)
    eval_workers: int = 1                               # with eval_batch: threads making the batched calls at once
    eval_slots: int = 0                                 # of which at the start (0: all); on_running grants more
    count: bool = True                                  # under the counting QEMU where it is set up (an emulated
                                                        # class's first shard: counts are exact, one is enough)
    describe: bool = False                              # also describe its runtime graph after the run (harness
                                                        # --describe: describe.json, optimized-LEVEL.onnx)
    pair_with: tuple[Path, ...] = ()                    # after the run, interleave its calls with these artifacts'
    pairs: int = 0                                      # (the FP32 reference's, the incumbent's) for this many
                                                        # rounds at most: extra.paired (harness_paired.py, native)
    pair_sha256: tuple[str, ...] = ()                   # pair_with's content hashes, stamped in extra.paired
    # set when the gate no longer needs this run (execution.cancel): the backend stops what it started for it
    cancel: Cancel | None = field(default=None, compare=False, repr=False)
    # a backend with `takes_slot_hooks` calls on_start right before the harness starts (the run slot is taken
    # there, after the container is made and its files are in) and on_exited once it has ended (given back before
    # the results are read back and the container removed); both may be called again on a retried attempt
    on_start: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    on_exited: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    # a backend that spreads batched calls (spreads_calls) calls on_running(grant) once the harness runs with
    # eval_workers > 1: each grant() lets it make one more call at once (the orchestrator calls it per run slot)
    on_running: Callable[[Callable[[], None]], None] | None = field(default=None, compare=False, repr=False)
    # called with the result when a backend has this job's folder complete before the whole start ends
    # (several artifacts in one container): the orchestrator puts it in place at once
    on_done: Callable[[TargetResult], None] | None = field(default=None, compare=False, repr=False)

    def harness_args(self, model: str, data: str, out: str) -> list[str]:
        return harness_command([self], [model], data, [out])


def python_entrypoint(dc: DeviceClass, script: str) -> list[str]:
    """A container's entry point running `script` with the image's Python, under the class's launcher (QEMU for
    an emulated x86 CPU: the runtime then sees that CPU's CPUID, as it would on the device)."""
    return [*dc.launcher, "/usr/bin/python3" if dc.launcher else "python3", "-s", script]


PAIRS_SECONDS = 30      # the interleaved calls' time at most (harness --pairs-seconds): whole pairs until then


def harness_command(jobs: list[Job], models: list[str], data: str, outs: list[str],
                    partners: list[list[str]] | None = None) -> list[str]:
    """The harness's arguments for jobs that share a class, data and samples: one (model, out) pair per job;
    `partners`: per job, where the artifacts its calls are interleaved with (Job.pair_with) are."""
    job, dc = jobs[0], jobs[0].device_class
    args = ["--runtime", dc.runtime]
    for model, out in zip(models, outs):
        args += ["--model", model, "--out", out]
    args += ["--data", data, "--threads", str(dc.threads), "--batch-size", str(dc.batch_size),
             "--warmup", str(job.warmup)]
    args += ["--samples", f"{job.samples[0]}:{job.samples[1]}"] if job.samples else []
    if job.eval_batch > dc.batch_size:
        args += ["--eval-batch", str(job.eval_batch), "--latency-calls", str(job.latency_calls)]
        args += ["--eval-workers", str(job.eval_workers)] if job.eval_workers > 1 else []
        args += ["--eval-slots", str(job.eval_slots)] if job.eval_workers > 1 and job.eval_slots else []
    args += ["--compare-rounds", str(job.compare_rounds)] if job.compare_rounds else []
    args += ["--timeout", str(dc.limits.timeout_s)] if len(jobs) > 1 else []    # each artifact its own time
    for n, j in enumerate(jobs):
        args += ["--describe", str(n)] if j.describe else []
        passes = j.device_class.disabled_passes
        args += ["--disabled", f"{n}={','.join(passes)}"] if passes else []
    if dc.emulated and any(j.describe for j in jobs):     # its load time is not gated: no second session
        args += ["--describe-at-load"]
    for n, (j, pair_models) in enumerate(zip(jobs, partners or [])):
        if pair_models and j.pairs > 0:               # one artifact per start pairs (the candidate)
            args += ["--pair-index", str(n), "--pairs", str(j.pairs), "--pairs-seconds", str(PAIRS_SECONDS)]
            args += [arg for model in pair_models for arg in ("--pair-model", model)]
            break
    return args + (["--profile"] if job.profile else [])


def start_timeout(jobs: list[Job]) -> int:
    """The host's limit on one harness start: the class's timeout for a single artifact; for several, each has it
    in the harness (a child past it is killed alone) and the start as a whole (runtime import, data load) one
    more, as a backstop."""
    timeout = jobs[0].device_class.limits.timeout_s
    return timeout if len(jobs) == 1 else timeout * (len(jobs) + 1)


def groupable(jobs: list[Job]) -> bool:
    """Jobs one harness start can run: same class, data, samples, evaluation, options and environment."""
    def shape(j: Job):
        return (j.device_class.name, j.data_npz, j.samples, j.eval_batch, j.latency_calls, j.count, j.warmup,
                j.eval_workers, j.eval_slots, j.profile, j.compare_rounds, tuple(sorted(j.env.items())))
    return len({shape(j) for j in jobs}) == 1


def run_group(backend, jobs: list[Job]) -> list[TargetResult]:
    """Every job's result: in one harness start where the backend can (`run_many`), else one run each."""
    many = getattr(backend, "run_many", None)
    if many is not None and len(jobs) > 1 and groupable(jobs):
        return many(jobs)
    return [backend.run(job) for job in jobs]


class Backend(Protocol):
    """Runs one job and leaves its result folder; a failed run is a failed result, never an exception.

    Optional attributes the orchestrator reads: `engine_problem()` (why the engine does
    not answer, or None: asked after a failed run, so that an engine fault is never a
    verdict) and `caches_locally` (False when the backend's own side keeps the run cache).
    """

    name: str

    def run(self, job: Job) -> TargetResult: ...


def host_fields(job: Job) -> dict:
    """What the host knows about a run before it starts."""
    dc = job.device_class
    fields = {"tier": dc.tier, "runtime": dc.runtime, "emulated": dc.emulated, "threads": dc.threads,
              "batch_size": dc.batch_size, "data_sha256": job.data_sha256 or file_sha256(job.data_npz),
              "artifact_sha256": job.artifact_sha256}
    if job.image is not None:
        fields.update(image=job.image.tag, image_id=job.image.image_id,
                      artifact_sha256=job.artifact_sha256 or job.image.labels.get(f"{LABEL}.artifact.sha256", ""))
    return fields


FAILED_FILE = "failed.json"      # the harness's word on an artifact whose child process failed (several per start)


def read_harness_result(job: Job, host: dict, log_tail: str, *, oom: bool = False) -> TargetResult:
    """The harness's result.json merged with the host's fields, or a failed result saying why.

    `oom`: the container was killed at its memory limit (a child killed by SIGKILL is then out of memory)."""
    path = job.out_dir / RESULT_FILE
    if (job.out_dir / FAILED_FILE).is_file():
        return child_failure(job, host, log_tail, oom=oom)
    if not path.is_file() or not (job.out_dir / OUTPUTS_FILE).is_file():
        return failed(job.device_class.name, "the harness exited 0 but wrote no result", log_tail=log_tail, **host)
    try:
        data = json.loads(path.read_text())
        too_large = over_output_limit(job.out_dir)      # the arrays' headers only: nothing loaded
    except json.JSONDecodeError as exc:
        return failed(job.device_class.name, f"the harness wrote an unreadable result: {exc}",
                      log_tail=log_tail, **host)
    except InputError as exc:
        return failed(job.device_class.name, f"the harness wrote unreadable outputs: {exc.one_line()}",
                      log_tail=log_tail, **host)
    if too_large:
        return failed(job.device_class.name, too_large, log_tail=log_tail, **host)
    merged = {**host, **{k: data[k] for k in HARNESS_FIELDS if k in data}}
    try:
        result = TargetResult.from_json({"device_class": job.device_class.name, "status": "ok",
                                         "log_tail": log_tail, **merged})
    except (TypeError, ValueError, AttributeError) as exc:
        return failed(job.device_class.name, f"the harness wrote an unreadable result: {exc}",
                      log_tail=log_tail, **host)
    if result.device is not None:
        result.device.emulated = bool(result.emulated)
    paired = result.extra.get("paired")
    if isinstance(paired, dict):            # which artifacts the calls were interleaved with, by content
        for partner, sha in zip(paired.get("partners") or [], job.pair_sha256):
            partner["sha256"] = sha
    return result


def harness_spoke(job: Job) -> bool:
    """The harness finished this job (result written) or said why it failed, before its process ended: a
    process that fails later (a timeout, a crash) does not lose what it already measured."""
    out = job.out_dir
    return (out / FAILED_FILE).is_file() or ((out / RESULT_FILE).is_file() and (out / OUTPUTS_FILE).is_file())


def child_failure(job: Job, host: dict, log_tail: str, *, oom: bool = False) -> TargetResult:
    """A failed result from the harness's failed.json (one artifact of several in one start)."""
    dc = job.device_class
    try:
        said = json.loads((job.out_dir / FAILED_FILE).read_text())
        code, text = int(said.get("code", 1)), str(said.get("reason", ""))
        timed_out = said.get("timed_out") is True
    except (OSError, ValueError, TypeError, AttributeError):
        code, text, timed_out = 1, "the harness wrote an unreadable failed.json", False
    if timed_out:       # the harness killed this artifact at the class's timeout (each artifact has its own)
        return failed(dc.name, f"timed out after {dc.limits.timeout_s} s", log_tail=log_tail, **host)
    killed = code == -signal.SIGKILL and oom
    reason = exit_reason(code, oom=killed, memory=dc.limits.memory if code < 0 else "")
    if code > 0:
        reason += f": {text}"
    return failed(dc.name, reason, log_tail=log_tail,
                  oom_limit_bytes=dc.limits.memory_bytes if killed else None, **host)


def exit_reason(code: int, *, oom: bool = False, memory: str = "") -> str:
    """One line for a harness that did not exit 0 (code as Docker reports it: 128+signal)."""
    if oom:
        return f"out of memory: killed at the device class's memory limit ({memory})"
    signum = code - 128 if code > 128 else -code if code < 0 else 0
    if signum == signal.SIGSEGV:
        return "crashed (segfault)"
    if signum == signal.SIGKILL and memory:
        return f"killed (SIGKILL; memory limit {memory} may have been reached)"
    if signum:
        try:
            return f"crashed (signal {signal.Signals(signum).name})"
        except ValueError:
            return f"crashed (signal {signum})"
    return f"the harness exited with code {code}"


def clear_outputs(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (RESULT_FILE, OUTPUTS_FILE, FAILED_FILE):
        (out_dir / name).unlink(missing_ok=True)


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


