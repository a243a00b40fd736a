"""Running targets: one (`run_target`), many in parallel (`run_targets`), backend choice."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from tiergate import results
from tiergate.images import BuiltImage
from tiergate.errors import InputError, TiergateError
from tiergate.execution.base import DEFAULT_WARMUP, Backend, Job, run_group
from tiergate.execution.docker_backend import DockerBackend
from tiergate.execution.local import LocalProcessBackend
from tiergate.results import TargetResult, failed
from tiergate.targets import DeviceClass, resolve


def backend_for(job_or_class: Job | DeviceClass) -> Backend:
    """The local process backend for a job without an image; else Docker on the class's engine."""
    if isinstance(job_or_class, Job):
        if job_or_class.image is None:
            return LocalProcessBackend()
        job_or_class = job_or_class.device_class
    return DockerBackend(job_or_class.docker_host, gpu=job_or_class.gpu)


def run_target(device_class: DeviceClass | str, image: BuiltImage | None, data_npz: Path, out_dir: Path, *,
               artifact_path: Path | None = None, artifact_sha256: str = "", warmup: int = DEFAULT_WARMUP,
               env: dict[str, str] | None = None, backend: Backend | None = None) -> TargetResult:
    """Run one target and save its result folder (result.json + outputs.npz) in `out_dir`.

    With `image=None` the harness runs in a local process on `artifact_path`.
    A failed run is a saved, failed result, not an exception; unusable input
    (no data file, no artifact) raises InputError.
    """
    dc = resolve([device_class])[0] if isinstance(device_class, str) else device_class
    job = Job(dc, Path(data_npz), Path(out_dir), image=image, artifact_path=artifact_path,
              artifact_sha256=artifact_sha256, warmup=warmup, env=dict(env or {}))
    check_job(job)
    return execute(job, backend)


def check_job(job: Job) -> None:
    if not job.data_npz.is_file():
        raise InputError(f"{job.data_npz}: evaluation data does not exist")
    if job.image is None and (job.artifact_path is None or not Path(job.artifact_path).is_file()):
        raise InputError(f"{job.artifact_path}: artifact does not exist (needed without an image)")


def execute(job: Job, backend: Backend | None = None) -> TargetResult:
    """Run a job on its backend, stamp time and wall time, save the folder; never raises for a run."""
    return execute_group([job], backend)[0]


def execute_group(jobs: list[Job], backend: Backend | None = None) -> list[TargetResult]:
    """Run jobs of one class on the same samples (in one harness start where the backend can: run_group),
    stamp time and wall time, save each folder; never raises for a run."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    dc = jobs[0].device_class
    try:
        ran = run_group(backend or backend_for(jobs[0]), jobs)
    except TiergateError as exc:
        ran = [failed(dc.name, exc.one_line(), tier=dc.tier) for _ in jobs]
    except Exception as exc:  # noqa: BLE001 - one target's bug must not lose the others
        ran = [failed(dc.name, f"internal error: {type(exc).__name__}: {exc}", tier=dc.tier) for _ in jobs]
    for job, result in zip(jobs, ran):
        if result.ok and not job.out_dir.exists():     # put in place as it finished (Job.on_done)
            continue
        result.started_at = started
        result.wall_s = round(time.monotonic() - t0, 3)
        if not result.ok:
            (job.out_dir / results.OUTPUTS_FILE).unlink(missing_ok=True)
        results.save(result, job.out_dir)
    return ran


def run_targets(jobs: list[Job], max_parallel: int = 2) -> list[TargetResult]:
    """Run jobs on up to `max_parallel` threads; results in the jobs' order, a failure never loses another."""
    def one(job: Job) -> TargetResult:
        try:
            check_job(job)
        except InputError as exc:
            job.out_dir.mkdir(parents=True, exist_ok=True)
            result = failed(job.device_class.name, exc.one_line(), tier=job.device_class.tier)
            results.save(result, job.out_dir)
            return result
        return execute(job)

    with ThreadPoolExecutor(max_workers=max(1, max_parallel), thread_name_prefix="tiergate-run") as pool:
        return list(pool.map(one, jobs))
