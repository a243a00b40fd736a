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
from dataclasses import dataclass

from prefect import task  # noqa: F401 - the worker side runs inside a Prefect flow

from tiergate import leases, results
from tiergate.errors import InfrastructureFault
from tiergate.images import BuiltImage
from tiergate.targets import DeviceClass

TARGET_FLOW = "tiergate-run-target"
POLL_S = 2


def deployment_name(pool: str) -> str:
    """One deployment of the run-target flow per work pool, named after the pool."""
    return f"{TARGET_FLOW}/{pool}"


@dataclass
class PoolBuilder:
    """Builds locally, except for pooled device classes: their worker builds on its own engine."""

    inner: object
    pools: dict[str, str]

    def build(self, device_class: DeviceClass, intake) -> BuiltImage:
        pool = self.pools.get(device_class.name)
        if pool is None:
            return self.inner.build(device_class, intake)
        return BuiltImage(tag=f"work-pool:{pool}", image_id=f"work-pool:{pool}", labels={}, reused=True)

    def describe(self, device_class: DeviceClass, intake, image: BuiltImage):
        """The runtime graph where the image is local; a pooled class's runtime is the worker's (not described)."""
        if device_class.name in self.pools or not hasattr(self.inner, "describe"):
            return None
        return self.inner.describe(device_class, intake, image)


class PoolBackend:
    """Runs a job through the work pool's run-target deployment; the result folder comes back here."""

    name = "work-pool"
    caches_locally = False       # the worker reuses recorded results of the same input itself

    def __init__(self, pool: str, remote):
        self.pool, self.remote = pool, remote

    def run(self, job) -> results.TargetResult:
        from prefect.deployments import run_deployment

        from tiergate.registry import Store

        dc = job.device_class
        flow_run = run_deployment(deployment_name(self.pool), timeout=None, poll_interval=POLL_S,
                                  parameters={"artifact": job.artifact_sha256, "device_class": dc.name,
                                              "role": job.role, "data": self.remote.data,
                                              "registry_url": self.remote.registry_url,
                                              "store": self.remote.store})
        state = flow_run.state
        if state is None or not state.is_completed():
            raise InfrastructureFault(f"{job.role} on {dc.name}: the run on work pool {self.pool} ended "
                                      f"{state.name if state else 'without a state'}: "
                                      f"{state.message if state else ''}")
        done = state.result()
        Store(self.remote.store).fetch(done["result_key"], job.out_dir)
        result = results.load(job.out_dir)
        result.extra = {**result.extra, "reused": bool(done["cached"]), "work_pool": self.pool,
                        "worker_host": done["host"]}
        return result


@leases.for_its_life     # the image it builds or finds is leased until its run is stored (docs/gc.md)
def run_here(artifact: str, device_class: str, role: str, data: str, registry_url: str | None,
             store: str | None) -> dict:
    """The worker's side: the orchestrator's build and run of one artifact on one class; the folder is stored."""
    from tiergate import orchestrator
    from tiergate.request import RunOptions
    from tiergate.orchestration.revalidation import artifact_sha, fetch
    from tiergate.paths import home
    from tiergate.registry import Registry
    from tiergate.targets import resolve

    dc = resolve([device_class])[0]
    with Registry(registry_url, store) as registry:
        path = fetch(registry, registry.artifact(artifact_sha(artifact)), home() / "worker")
        item = orchestrator.intake(path, [dc])
        eval_data = orchestrator.load_data(data, {role: item})
        spec = orchestrator.build_images([orchestrator.RunSpec(role, dc, item)], orchestrator.DockerBuilder())[0]
        done = orchestrator.run_one(spec, eval_data, orchestrator.default_backend_for(dc), RunOptions(registry=registry))
        key = registry.store.put_result(done.folder)
    return {"result_key": key, "cached": done.cached, "started": done.started, "host": socket.gethostname(),
            "device_class": dc.name, "role": role}
