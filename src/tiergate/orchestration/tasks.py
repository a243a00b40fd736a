"""The pipeline's steps as Prefect tasks; retries for infrastructure faults only.

A model that crashes, times out or runs out of memory is a failed run: it is
saved, gated and recorded, never retried. An engine that does not answer is an
infrastructure fault: the execution layer already retries it a few times within
one attempt, and the task is retried after a pause (`retry_condition_fn`).
Whether a failed run or build was the engine's fault is decided by asking the
engine afterwards: a failure with the engine gone is the engine's.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tiergate import pipeline
from tiergate.errors import InfrastructureFault
from tiergate.targets import DeviceClass

INFRA_RETRIES = 2
INFRA_RETRY_DELAY_S = float(os.environ.get("TIERGATE_INFRA_RETRY_DELAY_S", "5"))
# containers at a time in this process (the flow's thread pool is wider: builds and remote waits)
_RUNS_AT_A_TIME = threading.BoundedSemaphore(int(os.environ.get("TIERGATE_MAX_PARALLEL", "2")))


@dataclass(frozen=True)
class RunDone:
    """Where one run's result folder is, and whether a container was started for it."""

    role: str
    device_class: str
    folder: Path
    cached: bool
    started: bool


def infrastructure_only(_task, _task_run, state) -> bool:
    """retry_condition_fn: retry a task only when it failed with an InfrastructureFault."""
    try:
        state.result()
    except InfrastructureFault:
        return True
    except BaseException:  # noqa: BLE001 - any other failure is final
        return False
    return False


def engine_problem(device_class: DeviceClass) -> str | None:
    """Why the class's Docker engine does not answer, or None when it does."""
    from tiergate.execution.engine import connect

    try:
        connect(device_class.docker_host).close()
    except InfrastructureFault as exc:
        return exc.one_line()
    return None


_RETRY = dict(retries=INFRA_RETRIES, retry_delay_seconds=INFRA_RETRY_DELAY_S,
              retry_condition_fn=infrastructure_only, cache_policy=NO_CACHE)


@task(name="intake", task_run_name="intake {role}", cache_policy=NO_CACHE)
def intake_task(role: str, path: Path, device_classes: list[DeviceClass]) -> pipeline.Intake:
    """Load, fingerprint and lint one artifact."""
    return pipeline.intake(path, device_classes)


@task(name="diff", task_run_name="diff against {previous_sha:.12}", cache_policy=NO_CACHE)
def diff_task(previous: Path, previous_sha: str, new: Path) -> dict:
    """Position-matched diff of the model's previous artifact and the new one (JSON shape of `tiergate diff`)."""
    from tiergate.artifact import load_artifact
    from tiergate.diff import diff_artifacts

    return diff_artifacts(load_artifact(previous), load_artifact(new)).to_json()


@task(name="build", task_run_name="build images for {device_class.name}", **_RETRY)
def build_task(device_class: DeviceClass, specs: list[pipeline.RunSpec], base_image: str | None = None,
               ca_bundle: Path | None = None) -> list[pipeline.RunSpec]:
    """Build (or reuse) the images of one device class; sets spec.image or spec.build_error."""
    for spec in specs:
        spec.image, spec.build_error = None, None
    pipeline.build_images(specs, base_image=base_image, ca_bundle=ca_bundle)
    if any(spec.build_error for spec in specs):
        problem = engine_problem(device_class)
        if problem:
            raise InfrastructureFault(f"building images for {device_class.name} failed and the engine is gone: "
                                      f"{problem}")
    return specs


@task(name="run", task_run_name="run {spec.role} on {spec.device_class.name}", **_RETRY)
def run_task(spec: pipeline.RunSpec, data, root: Path | None = None, registry=None) -> RunDone:
    """Run one spec (or reuse its saved or recorded result); an engine fault raises InfrastructureFault."""
    dc = spec.device_class
    folder, job = pipeline.plan_run(spec, data, root=root, registry=registry)
    if job is None:
        return RunDone(spec.role, dc.name, folder, cached=spec.image is not None, started=False)
    from tiergate.execution.run import execute

    with _RUNS_AT_A_TIME:
        result = execute(job)
    if not result.ok:
        problem = engine_problem(dc)
        if problem:
            raise InfrastructureFault(f"{spec.role} on {dc.name}: the run failed and the engine is gone: {problem}")
    return RunDone(spec.role, dc.name, folder, cached=False, started=True)
