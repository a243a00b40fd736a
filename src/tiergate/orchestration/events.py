"""The Prefect event `tiergate register` emits (it triggers the revalidation deployment).

`prefect_api_url` reads the API URL without importing Prefect, so a registration with
no Prefect API configured costs nothing.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

EVENT = "tiergate.artifact.registered"


def prefect_api_url() -> str | None:
    """PREFECT_API_URL from the environment or the active Prefect profile, read without importing Prefect."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    prefect_home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH") or prefect_home / "profiles.toml")
    try:
        data = tomllib.loads(profiles.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or data.get("active", "ephemeral")
    return data.get("profiles", {}).get(active, {}).get("PREFECT_API_URL") or None


def emit_registered(record, reference) -> str:
    """Emit the Prefect event naming the artifact; returns what happened, in a few words.

    Without a Prefect API to send to, nothing is emitted: Prefect would otherwise start a
    throw-away local server (many seconds) whose events nobody can see.
    """
    if not prefect_api_url():
        return "not sent (no Prefect API: set PREFECT_API_URL)"
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    resource = {"prefect.resource.id": f"tiergate.artifact.{record.sha256}",
                "prefect.resource.name": f"{record.model}@{record.short}",
                "tiergate.model": record.model, "tiergate.format": record.format,
                "tiergate.precision": record.precision}
    related = [{"prefect.resource.id": f"tiergate.artifact.{reference.sha256}", "prefect.resource.role": "reference"}]
    payload = {"sha256": record.sha256, "parent_sha": record.parent_sha, "reference_sha": reference.sha256,
               "tags": record.tags, "store_key": record.store_key}
    try:
        event = emit_event(event=EVENT, resource=resource, related=related, payload=payload)
        EventsWorker.drain_all(timeout=10)
    except Exception as exc:  # noqa: BLE001 - the artifact is recorded; a lost event is only reported
        return f"not sent ({type(exc).__name__}: {exc})"
    return f"sent (id {event.id})" if event is not None else "not sent (Prefect events are disabled)"
