"""The registry's tables (SQLAlchemy Core): artifacts, runs, decisions, checks, aliases, explanations.

A table added after schema 1 (`explanations`) is created where it is first written and read as empty
where it is absent (`Registry.record_explanation` / `Registry.explanations`): a registry made by an
older tiergate needs no migration and keeps schema 1 (`ADDED_TABLES`).

Timestamps are stored as naive UTC and read back as aware UTC datetimes, so the
same schema works on SQLite (one file, no server) and PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator

SCHEMA_VERSION = 1
SHA = String(64)
NAME = String(128)


class UTCDateTime(TypeDecorator):
    """A datetime kept as naive UTC in the database, handed back aware (UTC)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("registry timestamps must be timezone-aware")
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect):
        return None if value is None else value.replace(tzinfo=timezone.utc)


metadata = MetaData()

meta = Table(
    "tiergate_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

artifacts = Table(
    "artifacts", metadata,
    Column("sha256", SHA, primary_key=True),
    Column("model", NAME, nullable=False, index=True),
    Column("format", String(16), nullable=False),
    Column("precision", String(32), nullable=False),
    Column("fingerprint", JSON, nullable=False),
    Column("parent_sha", SHA, ForeignKey("artifacts.sha256"), nullable=True),
    Column("reference_sha", SHA, ForeignKey("artifacts.sha256"), nullable=True),
    Column("config_sha", SHA, nullable=True),
    Column("tags", JSON, nullable=False),
    Column("filename", String(256), nullable=False),
    Column("size_bytes", Integer, nullable=False),
    Column("store_key", Text, nullable=False),
    Column("registered_at", UTCDateTime, nullable=False, index=True),
)

runs = Table(
    "runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("artifact_sha", SHA, ForeignKey("artifacts.sha256"), nullable=False),
    Column("device_class", String(64), nullable=False),
    Column("tier", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("image_id", String(128), nullable=False),
    Column("data_sha256", SHA, nullable=False),
    Column("emulated", Boolean, nullable=False),
    Column("machine", String(32), nullable=False),
    Column("versions", JSON, nullable=False),
    Column("metrics", JSON, nullable=False),
    Column("result_key", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_runs_cache_key", "artifact_sha", "device_class", "image_id", "data_sha256"),
)

decisions = Table(
    "decisions", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("artifact_sha", SHA, ForeignKey("artifacts.sha256"), nullable=False, index=True),
    Column("model", NAME, nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("tiers", JSON, nullable=False),
    Column("reasons", JSON, nullable=False),
    Column("cost_tags", JSON, nullable=False),
    Column("detail", JSON, nullable=False),
    Column("decided_at", UTCDateTime, nullable=False),
)

checks = Table(
    "decision_checks", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("decision_id", Integer, ForeignKey("decisions.id"), nullable=False, index=True),
    Column("name", String(128), nullable=False),
    Column("passed", Boolean, nullable=False),
    Column("device_class", String(64), nullable=True),
    Column("value", JSON, nullable=True),        # a number, or a string such as a status
    Column("threshold", JSON, nullable=True),
    Column("detail", Text, nullable=False),
    Column("tier", String(64), nullable=True),
    Column("op", String(8), nullable=True),
    Column("output", String(256), nullable=True),
)

decision_runs = Table(
    "decision_runs", metadata,
    Column("decision_id", Integer, ForeignKey("decisions.id"), primary_key=True),
    Column("run_id", Integer, ForeignKey("runs.id"), primary_key=True),
)

aliases = Table(
    "aliases", metadata,
    Column("model", NAME, primary_key=True),
    Column("tier", String(64), primary_key=True),
    Column("artifact_sha", SHA, ForeignKey("artifacts.sha256"), nullable=False),
    Column("decision_id", Integer, ForeignKey("decisions.id"), nullable=False),
    Column("moved_at", UTCDateTime, nullable=False),
)

alias_history = Table(
    "alias_history", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("model", NAME, nullable=False),
    Column("tier", String(64), nullable=False),
    Column("artifact_sha", SHA, ForeignKey("artifacts.sha256"), nullable=False),
    Column("previous_sha", SHA, nullable=True),
    Column("decision_id", Integer, ForeignKey("decisions.id"), nullable=False),
    Column("moved_at", UTCDateTime, nullable=False),
    UniqueConstraint("decision_id", "tier", name="uq_alias_move_per_decision_tier"),
    Index("ix_alias_history_model_tier", "model", "tier"),
)

explanations = Table(   # `tiergate explain` of a decision's candidate (gate --explain, the demo), as recorded
    "explanations", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("decision_id", Integer, ForeignKey("decisions.id"), nullable=False, index=True),
    Column("explanation", JSON, nullable=False),      # tiergate.explain.Explanation.to_json()
    Column("recorded_at", UTCDateTime, nullable=False),
)

ADDED_TABLES = (explanations,)   # created on first write, absent (read as empty) in older registries
