"""Helpers for the registry tests: tiny real ONNX models (tests/modelkit.py), a direct artifact record."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import modelkit as mk
from tiergate.registry import Registry
from tiergate.registry.store import file_sha256

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_onnx(path: Path, seed: int = 0, external: str | None = None) -> Path:
    """The factory's tiny classifier (4 features, 3 classes, weights from `seed`) at `path`."""
    return mk.write(mk.classifier(seed=seed), path, external=external)


def add(registry: Registry, path: Path, model: str = "digits", at: datetime | None = None, **fields):
    """Record a model file straight through Registry.add_artifact (no fingerprinting)."""
    return registry.add_artifact(path, sha256=file_sha256(path), model=model, format="onnx", precision="fp32",
                                 fingerprint={"structure": "test"}, at=at or T0, **fields)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)
