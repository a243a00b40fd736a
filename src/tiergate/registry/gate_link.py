"""Recording a gate decision (tiergate.gate.Decision, or its to_json() dict) in the registry.

Maps the gate's per-device-class metrics to the flat run-metrics shape the drift
report reads (docs/registry.md), turns its checks into registry checks, and records
decision + checks + runs + alias moves in one transaction.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Iterable

from tiergate.registry.db import Registry
from tiergate.registry.records import Check, DecisionRecord, NewRun

METRIC_KEYS = ("accuracy", "cosine", "sqnr_db", "max_abs_error", "latency_p50_ms", "latency_p99_ms", "cost_per_1k",
               "peak_memory_mb", "load_ms", "first_inference_ms", "artifact_mb", "instructions_per_inference")
"""The flat run-metrics keys (docs/registry.md); a run's metrics carry these plus "emulated"."""


def _as_json(decision: Any) -> dict:
    return decision.to_json() if hasattr(decision, "to_json") else dict(decision)


def _worst(outputs: dict[str, dict], key: str, pick) -> float | None:
    values = [o.get(key) for o in outputs.values() if isinstance(o.get(key), (int, float))]
    return pick(values) if values else None


def flat_metrics(target: dict) -> dict[str, Any]:
    """The flat run-metrics shape (METRIC_KEYS + "emulated") from one device class's entry in
    Decision.to_json()["metrics"]. The one home of this mapping; the drift report reads it back
    (tiergate.registry.report_data.report_metrics)."""
    outputs = target.get("outputs") or {}
    latency = (target.get("latency") or {}).get("candidate") or {}
    accuracy = (target.get("accuracy") or {}).get("candidate") or {}
    return {
        "accuracy": accuracy.get("value"),
        "cosine": _worst(outputs, "cosine", min),
        "sqnr_db": _worst(outputs, "sqnr_db", min),
        "max_abs_error": _worst(outputs, "max_abs_error", max),
        "latency_p50_ms": latency.get("p50_ms"),
        "latency_p99_ms": latency.get("p99_ms"),
        "cost_per_1k": (target.get("cost_per_1k") or {}).get("candidate"),
        **_device(target),
        "emulated": bool(target.get("emulated", False)),
    }


def _device(target: dict) -> dict[str, float | None]:
    """The candidate's device figures in the units a policy uses (tiergate.metrics.device)."""
    figures = (target.get("device") or {}).get("candidate") or {}
    mb = 1024 * 1024

    def scaled(key: str, scale: float = 1.0):
        value = figures.get(key)
        return value / scale if isinstance(value, (int, float)) else None

    return {"peak_memory_mb": scaled("peak_memory_bytes", mb), "load_ms": scaled("load_ms"),
            "first_inference_ms": scaled("first_inference_ms"), "artifact_mb": scaled("artifact_bytes", mb),
            "instructions_per_inference": scaled("instructions_per_inference")}


def checks_of(decision: Any) -> list[Check]:
    return [Check.from_json(c) for c in _as_json(decision).get("checks", [])]


def tiers_of(decision: Any) -> list[str]:
    data = _as_json(decision)
    tiers = {m.get("tier") for m in data.get("metrics", {}).values()} | {c.get("tier") for c in data.get("checks", [])}
    return sorted(t for t in tiers if t)


def _filled(run: NewRun, target: dict) -> NewRun:
    """The run with its tier and flat metrics taken from the gate where the run does not say them."""
    return dataclasses.replace(run, tier=run.tier or target.get("tier", ""),
                               metrics={**flat_metrics(target), **run.metrics})


def record_gate_decision(registry: Registry, artifact_sha: str, decision: Any, *,
                         runs: Iterable[NewRun | int] = (), cost_tags: dict[str, str] | None = None,
                         tiers: Iterable[str] | None = None, at: datetime | None = None,
                         reuse_same: bool = False) -> DecisionRecord:
    """Record a gate decision; each NewRun gets the flat metrics of its device class (its own keys win).

    A PROMOTE moves the model's alias on every tier the decision covered (or `tiers`).
    """
    data = _as_json(decision)
    per_class = data.get("metrics", {})
    filled = [_filled(r, per_class.get(r.device_class, {})) if isinstance(r, NewRun) else r for r in runs]
    return registry.record_decision(
        artifact_sha, data["verdict"], tiers=list(tiers) if tiers is not None else tiers_of(data),
        reasons=data.get("reasons", []), checks=checks_of(data), cost_tags=cost_tags, detail=data,
        runs=filled, at=at, reuse_same=reuse_same)
