"""Decisions and the fast path's entries: a decision's inputs by content, its key, and the sealed files read and
written with their schema."""

from __future__ import annotations

import hashlib
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from tiergate.state.names import DECISION_SCHEMA, decision_path, quick_entry_path
from tiergate.state.seal import read_sealed, write_sealed


def classes_identity(device_classes) -> str:
    """A decision's `device_classes` input: the classes by content (the orchestrator and the fast path alike)."""
    import dataclasses

    text = "\n".join(json.dumps(dataclasses.asdict(dc), sort_keys=True, default=str) for dc in device_classes)
    return hashlib.sha256(text.encode()).hexdigest()


def policy_identity(policy) -> str:
    """A decision's `policy` input: the effective policy by content (defaults, per-tier overrides, metrics) and
    the files it came from (the decision names them in `policy_sources`: two files of one content are two
    decisions, each naming its own file)."""
    import dataclasses

    parts = [dataclasses.asdict(policy.defaults), policy.overrides, policy.metrics, list(policy.sources)]
    if getattr(policy, "outputs", None):
        parts.append(policy.outputs)          # (absent when empty: the keys of decisions made before it hold)
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def decision_key_of(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def read_decision(key: str, inputs: dict, *, discard: bool = False) -> dict | None:
    """The saved decision's JSON for exactly these inputs, when its seal verifies (read_sealed), or None. With
    `discard`, a file that does not verify is removed with a warning (the caller then decides again)."""
    doc, why = read_sealed(decision_path(key))
    if why in ("absent", "no key"):
        return None
    if doc is not None and doc.get("schema") == DECISION_SCHEMA and doc.get("key") == key \
            and doc.get("inputs") == inputs and isinstance(doc.get("decision"), dict):
        return doc["decision"]
    if discard:
        discard_decision(key, "its seal is missing or wrong (edited, or made under another cache key)"
                         if why == "unsealed" else "it does not match its inputs")
    return None


def discard_decision(key: str, why: str = "it does not match its inputs") -> None:
    path = decision_path(key)
    print(f"tiergate: warning: discarding the cached decision {path.name}: {why}; deciding again", file=sys.stderr)
    path.unlink(missing_ok=True)


def save_decision(key: str, inputs: dict, decision: dict) -> Path | None:
    """Write a decision (its JSON) with its inputs, sealed, atomically; None when it cannot be sealed (no usable
    cache key: the gate has decided, nothing is cached)."""
    doc = {"schema": DECISION_SCHEMA, "key": key, "created_at": now_iso(), "inputs": inputs, "decision": decision}
    return write_sealed(decision_path(key), doc, sort_keys=True)


def read_quick_entry(key: str) -> dict | None:
    """The fast path's entry for a request key when its seal verifies; None otherwise (the normal path runs)."""
    return read_sealed(quick_entry_path(key))[0]


def save_quick_entry(key: str, entry: dict) -> Path | None:
    return write_sealed(quick_entry_path(key), entry)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
