"""The one interface every backend implements, and what all of them share.

A `Job` is one artifact + one evaluation set on one device class. A backend's
`run(job)` runs the harness, leaves the harness's outputs.npz in `job.out_dir`
and returns a `TargetResult` (never raises for a failed run: a crash, an
out-of-memory kill or a timeout is a failed result with a reason and a log tail).
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tiergate.hashing import file_sha256
from tiergate.images import LABEL, BuiltImage
from tiergate.results import OUTPUTS_FILE, RESULT_FILE, TargetResult, failed
from tiergate.targets import DeviceClass

LOG_TAIL_LINES = 40
DEFAULT_WARMUP = 3
# fields of TargetResult the harness itself knows (the host adds the rest)
HARNESS_FIELDS = ("runtime", "versions", "machine", "threads", "batch_size", "n_samples",
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

    def harness_args(self, model: str, data: str, out: str) -> list[str]:
        dc = self.device_class
        args = ["--runtime", dc.runtime, "--model", model, "--data", data, "--out", out,
                "--threads", str(dc.threads), "--batch-size", str(dc.batch_size),
                "--warmup", str(self.warmup)]
        args += ["--compare-rounds", str(self.compare_rounds)] if self.compare_rounds else []
        return args + (["--profile"] if self.profile else [])


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


def read_harness_result(job: Job, host: dict, log_tail: str) -> TargetResult:
    """The harness's result.json merged with the host's fields, or a failed result saying why."""
    path = job.out_dir / RESULT_FILE
    if not path.is_file() or not (job.out_dir / OUTPUTS_FILE).is_file():
        return failed(job.device_class.name, "the harness exited 0 but wrote no result", log_tail=log_tail, **host)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        return failed(job.device_class.name, f"the harness wrote an unreadable result: {exc}",
                      log_tail=log_tail, **host)
    merged = {**host, **{k: data[k] for k in HARNESS_FIELDS if k in data}}
    try:
        result = TargetResult.from_json({"device_class": job.device_class.name, "status": "ok",
                                         "log_tail": log_tail, **merged})
    except (TypeError, ValueError, AttributeError) as exc:
        return failed(job.device_class.name, f"the harness wrote an unreadable result: {exc}",
                      log_tail=log_tail, **host)
    if result.device is not None:
        result.device.emulated = bool(result.emulated)
    return result


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
    for name in (RESULT_FILE, OUTPUTS_FILE):
        (out_dir / name).unlink(missing_ok=True)


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


