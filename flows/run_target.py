"""A share of a tier (its pending artifacts on a range of the samples) on one device class, run by a Prefect worker
on the host that has the devices (or a Docker engine of its own).

Deployed once per work pool as `tiergate-run-target/<pool>` (`tiergate serve --remote
CLASS=POOL`, or prefect.yaml); the gating flows call it for pooled device classes, one flow run per share
(tiergate.orchestration.remote). Its return value (the result folders' store keys) is persisted so the caller
can read it.
"""

from __future__ import annotations

from prefect import flow

from tiergate.orchestration.remote import TARGET_FLOW, run_here


@flow(name=TARGET_FLOW, persist_result=True, log_prints=True)
def run_target(artifacts: dict[str, str], device_class: str, data: str, registry_url: str | None = None,
               store: str | None = None, samples: list[int] | None = None, share: str | None = None,
               profile: bool = False) -> dict:
    """Fetch the artifacts (by role) and the evaluation archive from the registry store, build, run the share
    (samples [start, stop), or all), store the result folders; a heartbeat in the store while it runs."""
    return run_here(artifacts, device_class, data, registry_url, store, samples, share, profile)
