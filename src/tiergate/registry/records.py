"""What the registry hands out and takes in: plain frozen dataclasses, no database types."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tiergate.gate import Check  # the one Check type: the registry records the gate's checks as they are

VERDICTS = ("promote", "reject", "inconclusive")   # only a promotion moves an alias


@dataclass(frozen=True)
class ArtifactRecord:
    sha256: str
    model: str
    format: str
    precision: str
    fingerprint: dict[str, Any]
    parent_sha: str | None
    reference_sha: str | None
    config_sha: str | None
    tags: dict[str, str]
    filename: str
    size_bytes: int
    store_key: str
    registered_at: datetime

    @property
    def short(self) -> str:
        return self.sha256[:12]


@dataclass(frozen=True)
class RunRecord:
    id: int
    artifact_sha: str
    device_class: str
    tier: str
    status: str
    image_id: str
    data_sha256: str
    emulated: bool
    machine: str
    versions: dict[str, str]
    metrics: dict[str, Any]
    result_key: str | None
    created_at: datetime

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class NewRun:
    """A run to record. `metrics` follows the flat shape in docs/registry.md."""

    device_class: str
    tier: str
    status: str
    image_id: str
    data_sha256: str
    emulated: bool = False
    machine: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    result_folder: Path | None = None   # a tiergate.results folder to keep in the store

    @classmethod
    def from_result(cls, result, metrics: dict[str, Any] | None = None,
                    folder: Path | None = None) -> "NewRun":
        """From a tiergate.results.TargetResult (and the folder it was saved in)."""
        return cls(
            device_class=result.device_class, tier=result.tier, status=result.status,
            image_id=result.image_id, data_sha256=result.data_sha256, emulated=result.emulated,
            machine=result.machine, versions=dict(result.versions), metrics=dict(metrics or {}),
            result_folder=folder,
        )


@dataclass(frozen=True)
class DecisionRecord:
    id: int
    artifact_sha: str
    model: str
    verdict: str
    tiers: list[str]
    reasons: list[str]
    cost_tags: dict[str, str]
    detail: dict[str, Any]
    decided_at: datetime
    checks: tuple[Check, ...] = ()
    run_ids: tuple[int, ...] = ()
    reused: bool = False          # an identical decision of the artifact was already the latest one


@dataclass(frozen=True)
class AliasMove:
    model: str
    tier: str
    artifact_sha: str
    previous_sha: str | None
    decision_id: int
    moved_at: datetime
