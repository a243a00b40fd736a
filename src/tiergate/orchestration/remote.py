"""Runs on a Prefect work pool: a device class's targets run by a worker on the host that has the devices.

The gating flow sends each run of a pooled device class to the deployment
`tiergate-run-target/<pool>` (flows/run_target.py) and waits for it. The worker's
flow run fetches the artifact from the shared registry store, builds the image on
its own Docker engine, runs it (reusing a recorded result of the same input), puts
the result folder in the store and returns the store key as its (persisted) result.
The gating flow copies that folder back and compares as for a local run.

Shared between the hosts: the registry URL, the store (a folder both see, or an
fsspec URL), the evaluation data path, and Prefect's result storage
(PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK, or one PREFECT_LOCAL_STORAGE_PATH on one host).
"""

from __future__ import annotations

import socket
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tiergate.errors import InfrastructureFault
from tiergate.orchestration.tasks import RunDone
from tiergate.targets import DeviceClass

TARGET_FLOW = "tiergate-run-target"
POLL_S = 2


def deployment_name(pool: str) -> str:
    """One deployment of the run-target flow per work pool, named after the pool."""
    return f"{TARGET_FLOW}/{pool}"


@task(name="remote run", task_run_name="run {role} on {device_class.name} via work pool {pool}",
      cache_policy=NO_CACHE)
def remote_run_task(role: str, device_class: DeviceClass, pool: str, sha256: str, data: str,
                    registry_url: str | None, store: str | None, root: Path | None = None) -> RunDone:
    """Run one artifact on a pooled device class through a worker; the result folder comes back here."""
    from prefect.deployments import run_deployment

    from tiergate.pipeline import runs_root
    from tiergate.registry import Store

    flow_run = run_deployment(deployment_name(pool), timeout=None, poll_interval=POLL_S,
                              parameters={"artifact": sha256, "device_class": device_class.name, "role": role,
                                          "data": data, "registry_url": registry_url, "store": store})
    state = flow_run.state
    if state is None or not state.is_completed():
        raise InfrastructureFault(f"{role} on {device_class.name}: the run on work pool {pool} ended "
                                  f"{state.name if state else 'without a state'}: {state.message if state else ''}")
    done = state.result()
    folder = (root or runs_root()) / "remote" / done["result_key"].rsplit("/", 1)[-1]
    Store(store).fetch(done["result_key"], folder)
    return RunDone(role, device_class.name, folder, cached=done["cached"], started=done["started"])


def run_here(artifact: str, device_class: str, role: str, data: str, registry_url: str | None,
             store: str | None) -> dict:
    """The worker's side: build and run one artifact on one device class, store the result folder."""
    from tiergate import pipeline
    from tiergate.orchestration.revalidation import artifact_sha, fetch
    from tiergate.orchestration.tasks import build_task, intake_task, run_task
    from tiergate.paths import home
    from tiergate.registry import Registry
    from tiergate.targets import resolve

    dc = resolve([device_class])[0]
    with Registry(registry_url, store) as registry:
        path = fetch(registry, registry.artifact(artifact_sha(artifact)), home() / "worker")
        item = intake_task(role, path, [dc])
        eval_data = pipeline.load_data(data, {role: item})
        spec = build_task(dc, [pipeline.RunSpec(role, dc, item)])[0]
        done = run_task(spec, eval_data, None, registry)
        key = registry.store.put_result(done.folder)
    return {"result_key": key, "cached": done.cached, "started": done.started, "host": socket.gethostname(),
            "device_class": dc.name, "role": role}
