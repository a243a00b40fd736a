"""Runs on a Prefect work pool: a device class's runs made by the workers of the pool, on the hosts (and Docker
engines) they have, a tier's samples spread over them.

The gating flow sends each share of a pooled device class (a range of its samples, every pending artifact of the
tier: one harness start there) to the deployment `tiergate-run-target/<pool>` (flows/run_target.py) and watches it.
The worker's flow run fetches the artifacts and the evaluation archive from the shared registry store, builds the
images on its own Docker engine, runs the share (the orchestrator's run_tier: its cores' calls at once), puts each
result folder in the store and returns the store keys as its (persisted) result. The gate copies the folders back
and merges the shares in sample order, as it merges shards (orchestrator/spans.py).

A pool's tier is split into as many shares as the pool has workers online (`PoolBackend.share_count`), each share
one flow run any worker may take. While it runs, the worker beats a heartbeat in the store (`notes/<share>`); a
share whose heartbeat stops (its worker died) or whose flow run is cancelled or crashes is run again, by whichever
worker takes it next (at most SHARE_ATTEMPTS times); the shares that finished are kept (nothing measured is lost).

Shared between the hosts: the registry URL, the store (a folder both see, or an fsspec URL), and Prefect's result
storage (PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK, or one PREFECT_LOCAL_STORAGE_PATH on one host).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from prefect import task  # noqa: F401 - the worker side runs inside a Prefect flow

from tiergate import leases, results
from tiergate.errors import InfrastructureFault
from tiergate.images import BuiltImage
from tiergate.targets import DeviceClass

TARGET_FLOW = "tiergate-run-target"
POLL_S = 1.0
BEAT_S = 2.0                 # a worker's heartbeat, while its share runs
STALE_ENV = "TIERGATE_POOL_STALE_S"
STALE_S = 30.0               # a running share whose heartbeat has not moved for this long has lost its worker
SHARE_ATTEMPTS = 3           # a share run this many times (its worker died or it was cancelled) is a fault
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")


def deployment_name(pool: str) -> str:
    """One deployment of the run-target flow per work pool, named after the pool."""
    return f"{TARGET_FLOW}/{pool}"


def stale_s() -> float:
    return float(os.environ.get(STALE_ENV) or STALE_S)


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
    """Runs a tier's shares through the work pool's run-target deployment; the result folders come back here."""

    name = "work-pool"
    caches_locally = False       # the worker reuses recorded results of the same input itself
    takes_samples = True         # a share is a range of the samples (Job.samples)
    takes_slots = False          # a share runs on a worker's cores, not this machine's: no local run slot held

    def __init__(self, pool: str, remote, context=None):
        self.pool, self.remote = pool, remote
        self.context = context          # the gate's Prefect context (contextvars): its API and settings

    def _in_context(self, fn, *args):
        """fn(*args) in the gate's Prefect context (a copy: the spans' threads may call at once)."""
        return fn(*args) if self.context is None else self.context.copy().run(fn, *args)

    def share_count(self, n: int, requested: int | None = None, least: int = 1) -> int:
        """Shares of n samples: `requested` (--shards), else one per worker of the pool online (at least one), at
        most one per `least` samples."""
        wanted = requested or max(1, self._in_context(_workers_online, self.pool))
        return max(1, min(wanted, n // max(1, least)))

    def run(self, job) -> results.TargetResult:
        return self.run_many([job])[0]

    def run_many(self, jobs) -> list[results.TargetResult]:
        """One share (every job: the tier's pending artifacts on the same samples) run by a worker of the pool, run
        again where its worker dies or it is cancelled; the results in the jobs' order (failed ones where the gate
        stopped it: Job.cancel)."""
        from tiergate.registry import Store

        store = Store(self.remote.store)
        job, dc = jobs[0], jobs[0].device_class
        parameters = {"artifacts": {j.role: j.artifact_sha256 for j in jobs}, "device_class": dc.name,
                      "data": store.put_data(job.data_npz, job.data_sha256), "registry_url": self.remote.registry_url,
                      "store": self.remote.store, "samples": list(job.samples) if job.samples else None,
                      "profile": job.profile}
        where = f"{', '.join(j.role for j in jobs)} on {dc.name}" + \
            (f" samples {job.samples[0]}-{job.samples[1]}" if job.samples else "")
        lost = []
        for _ in range(SHARE_ATTEMPTS):
            share = f"share-{uuid.uuid4().hex}"
            outcome = self._in_context(_Share(self.pool, {**parameters, "share": share}, store, job.cancel, dc).watch)
            if outcome == "cancelled-by-gate":
                return [results.failed(dc.name, "stopped: the gate no longer needs this run", tier=dc.tier)
                        for _ in jobs]
            if isinstance(outcome, dict):
                return [self._fetched(store, j, outcome) for j in jobs]
            lost.append(outcome)
        raise InfrastructureFault(f"{where}: the share on work pool {self.pool} was lost {SHARE_ATTEMPTS} times "
                                  f"({'; '.join(lost)})")

    def _fetched(self, store, job, done: dict) -> results.TargetResult:
        """A share's result folder copied back, named as the gate's run of the share (the pool's image, the gate's
        data and samples), with where it ran in extra."""
        mine = done["results"][job.role]
        store.fetch(mine["result_key"], job.out_dir)
        result = results.load(job.out_dir)
        worker = {"host": done["host"], "engine": done["engine"], "image_id": result.image_id, "image": result.image}
        result.image, result.image_id, result.data_sha256 = job.image.tag, job.image.image_id, job.data_sha256
        result.extra = {**result.extra, "reused": bool(mine["cached"]), "work_pool": self.pool, "worker": worker}
        results.save(result, job.out_dir)
        return result


class _Share:
    """One attempt at a share: its flow run, watched until it ends, its worker's heartbeat stops, or the gate stops
    it. watch() -> the flow run's result (a dict), "cancelled-by-gate", or why the attempt was lost (a str)."""

    def __init__(self, pool: str, parameters: dict, store, cancel, dc: DeviceClass):
        self.pool, self.parameters, self.store, self.cancel, self.dc = pool, parameters, store, cancel, dc
        self.beat_key = f"notes/{parameters['share']}"

    def watch(self):
        from prefect.client.orchestration import get_client
        from prefect.deployments import run_deployment

        if self.cancel is not None and self.cancel.is_set():
            return "cancelled-by-gate"
        flow_run = run_deployment(deployment_name(self.pool), parameters=self.parameters, timeout=0)
        stop = threading.Event()
        forget = self.cancel.on_cancel(stop.set) if self.cancel is not None else (lambda: None)
        try:
            with get_client(sync_client=True) as client:
                return self._until_final(client, flow_run.id, stop)
        finally:
            forget()
            self._quietly(lambda: self.store.remove(self.beat_key))

    def _until_final(self, client, flow_run_id, stop: threading.Event):
        last_beat, moved = None, time.monotonic()
        waited_for_worker = time.monotonic()
        while True:
            run = client.read_flow_run(flow_run_id)
            kind = run.state.type.value if run.state else "PENDING"
            if kind in FINAL:
                return self._final(run, kind)
            if stop.is_set():
                self._set_state(client, flow_run_id, "cancelling")     # the worker kills what it runs for it
                return "cancelled-by-gate"
            now = time.monotonic()
            if kind == "RUNNING":
                beat = self._quietly(lambda: self.store.read_note(self.beat_key))
                if beat != last_beat:
                    last_beat, moved = beat, now
                elif now - moved > stale_s():
                    self._set_state(client, flow_run_id, "cancelled")  # its worker is gone: no one else will
                    return f"its worker stopped answering (no heartbeat for {stale_s():g} s, flow run {flow_run_id})"
            elif now - waited_for_worker > self.dc.limits.timeout_s:
                self._set_state(client, flow_run_id, "cancelled")
                raise InfrastructureFault(f"on {self.dc.name}: no worker of work pool {self.pool} took the share in "
                                          f"{self.dc.limits.timeout_s} s (is a worker running?)")
            if kind != "RUNNING":
                moved = now
            stop.wait(POLL_S)

    def _final(self, run, kind: str):
        if kind == "COMPLETED":
            return run.state.result()
        if kind == "FAILED":                # the worker's run raised: its engine, the store, the artifact
            raise InfrastructureFault(f"on {self.dc.name}: the run on work pool {self.pool} ended {run.state.name}: "
                                      f"{run.state.message or ''}")
        return f"flow run {run.id} ended {run.state.name}"      # cancelled or crashed: run again

    @staticmethod
    def _set_state(client, flow_run_id, which: str) -> None:
        from prefect.states import Cancelled, Cancelling

        _Share._quietly(lambda: client.set_flow_run_state(
            flow_run_id, Cancelling() if which == "cancelling" else Cancelled(message="its worker is gone"),
            force=True))

    @staticmethod
    def _quietly(fn):
        try:
            return fn()
        except Exception:  # noqa: BLE001 - a store or server that answers late: the next poll sees
            return None


def _workers_online(pool: str) -> int:
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            return sum(1 for w in client.read_workers_for_work_pool(pool)
                       if str(getattr(w.status, "value", w.status)).upper() == "ONLINE")
    except Exception:  # noqa: BLE001 - a pool the server does not know yet: one share
        return 1


# --- the worker's side ---------------------------------------------------------------------------------------


class _Heartbeat:
    """The worker's heartbeat in the store while its share runs: a counter rewritten every BEAT_S."""

    def __init__(self, store, share: str | None):
        self.store, self.key, self.stop = store, f"notes/{share}" if share else None, threading.Event()

    def __enter__(self):
        if self.key is not None:
            def beat():
                count = 0
                while not self.stop.is_set():
                    count += 1
                    _Share._quietly(lambda: self.store.write_note(self.key, f"{socket.gethostname()} {count}"))
                    self.stop.wait(BEAT_S)
            threading.Thread(target=beat, name="tiergate-share-heartbeat", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()


@leases.for_its_life     # the images it builds or finds are leased until its runs are stored (docs/gc.md)
def run_here(artifacts: dict[str, str], device_class: str, data: str, registry_url: str | None,
             store: str | None, samples: list[int] | None = None, share: str | None = None,
             profile: bool = False) -> dict:
    """The worker's side: the orchestrator's build and run of a share (the artifacts by role, on the samples
    [start, stop) of the stored archive `data`, all of it when None) on its own engine; the folders are stored."""
    import numpy as np

    from tiergate import orchestrator
    from tiergate.evaldata import select
    from tiergate.orchestration.revalidation import artifact_sha, fetch
    from tiergate.paths import home
    from tiergate.registry import Registry
    from tiergate.registry.masking import masked
    from tiergate.request import RunOptions
    from tiergate.targets import resolve

    dc = resolve([device_class])[0]
    with Registry(registry_url, store) as registry, _Heartbeat(registry.store, share):
        work = home() / "worker"
        intakes = {role: orchestrator.intake(fetch(registry, registry.artifact(artifact_sha(sha)), work), [dc])
                   for role, sha in artifacts.items()}
        archive = work / "data" / data.rsplit("/", 1)[-1]          # named by its content hash: fetched once
        if not archive.is_file():
            registry.store.fetch_file(data, archive)
        eval_data = orchestrator.load_data(archive, intakes)
        if samples:
            eval_data = select(eval_data, np.arange(*samples))
        specs = orchestrator.build_images([orchestrator.RunSpec(role, dc, item, profile=profile)
                                           for role, item in intakes.items()], orchestrator.DockerBuilder())
        done = orchestrator.run_tier(specs, eval_data, orchestrator.default_backend_for(dc),
                                     RunOptions(registry=registry))
        stored = {d.role: {"result_key": registry.store.put_result(d.folder), "cached": d.cached,
                           "started": d.started} for d in done}
    return {"results": stored, "host": socket.gethostname(), "device_class": dc.name,
            "engine": masked(os.environ.get("DOCKER_HOST", "local"))}

