"""One artifact on one device class, run by a Prefect worker on the host that has the devices.

Deployed once per work pool as `tiergate-run-target/<pool>` (`tiergate serve --remote
CLASS=POOL`, or prefect.yaml); the gating flows call it for pooled device classes.
Its return value (the result folder's store key) is persisted so the caller can read it.
"""

from __future__ import annotations

from prefect import flow

from tiergate.orchestration.remote import TARGET_FLOW, run_here


@flow(name=TARGET_FLOW, persist_result=True, log_prints=True)
def run_target(artifact: str, device_class: str, data: str, role: str = "candidate",
               registry_url: str | None = None, store: str | None = None) -> dict:
    """Fetch the artifact from the registry store, build, run (or reuse), store the result folder."""
    return run_here(artifact, device_class, role, data, registry_url, store)
