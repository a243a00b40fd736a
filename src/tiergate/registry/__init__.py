"""The registry: artifacts, runs, decisions, aliases and lineage (SQLAlchemy), and a content-addressed store.

The core imports neither Prefect nor Docker. See docs/registry.md.
"""

from tiergate.registry.db import URL_ENV, Registry, count_rows, default_url
from tiergate.registry.gate_link import METRIC_KEYS, flat_metrics, record_gate_decision
from tiergate.registry.intake import Registered, precision_of, register_artifact
from tiergate.registry.names import model_name
from tiergate.registry.records import (
    AliasMove,
    ArtifactRecord,
    Check,
    DecisionRecord,
    NewRun,
    RunRecord,
)
from tiergate.registry.store import STORE_ENV, Store

__all__ = [
    "METRIC_KEYS", "STORE_ENV", "URL_ENV", "AliasMove", "ArtifactRecord", "Check", "DecisionRecord", "NewRun",
    "Registered", "Registry", "RunRecord", "Store", "count_rows", "default_url", "flat_metrics", "model_name",
    "precision_of", "record_gate_decision", "register_artifact",
]
