"""The drift report's data: per tier, how each registered artifact did on each device class over time,
and the cross-tier drift matrix of the currently promoted artifacts.

Everything is read from the registry. Run metrics use the flat shape documented in
docs/registry.md (keys in METRIC_KEYS, plus "emulated"). The cross-tier matrix is
computed from the stored result folders (outputs.npz) of the promoted artifacts' runs.
The result is a JSON-able dict (see `build_drift_report`); html.py renders it.
"""

from __future__ import annotations

import math
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from tiergate.errors import InputError
from tiergate.registry import ArtifactRecord, DecisionRecord, Registry, RunRecord

REPORT_SCHEMA = 1
METRIC_KEYS = ("accuracy", "cosine", "sqnr_db", "max_abs_error", "latency_p50_ms", "latency_p99_ms", "cost_per_1k")
_ALIASES = {"max_abs_err": "max_abs_error"}  # accepted spellings in run metrics


def flat_metrics(metrics: dict[str, Any]) -> dict[str, float | None]:
    """The report's metric keys from a run's metrics dict; missing or non-numeric values become None."""
    named = {_ALIASES.get(k, k): v for k, v in metrics.items()}
    return {key: _number(named.get(key)) for key in METRIC_KEYS}


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def _pick_run(runs: list[RunRecord]) -> RunRecord:
    """The latest successful run, else the latest run."""
    ok = [r for r in runs if r.ok]
    return (ok or runs)[-1]


def _latest_verdict(decisions: list[DecisionRecord], tier: str) -> DecisionRecord | None:
    matching = [d for d in decisions if tier in d.tiers]
    return matching[-1] if matching else None


def _row(artifact: ArtifactRecord, run: RunRecord, decision: DecisionRecord | None, promoted: bool) -> dict:
    metrics = flat_metrics(run.metrics)
    return {
        "artifact_sha": artifact.sha256, "short": artifact.short, "registered_at": _iso(artifact.registered_at),
        "precision": artifact.precision, "format": artifact.format, "tags": artifact.tags,
        "device_class": run.device_class, "run_id": run.id, "status": run.status,
        "emulated": bool(run.metrics.get("emulated", run.emulated)), "machine": run.machine,
        "metrics": metrics,
        "decision": decision.verdict if decision else None,
        "reasons": decision.reasons if decision else [],
        "cost_tags": decision.cost_tags if decision else {},
        "promoted": promoted,
    }


def tier_rows(registry: Registry, artifacts: list[ArtifactRecord], promoted: dict[str, str]) -> dict[str, dict]:
    """tier -> {"device_classes": [...], "rows": [one per artifact and device class, oldest first]}."""
    tiers: dict[str, dict] = {}
    for artifact in artifacts:
        decisions = registry.decisions(artifact_sha=artifact.sha256)
        by_class: dict[tuple[str, str], list[RunRecord]] = {}
        for run in registry.runs(artifact_sha=artifact.sha256):
            by_class.setdefault((run.tier, run.device_class), []).append(run)
        for (tier, device_class), runs in sorted(by_class.items()):
            entry = tiers.setdefault(tier, {"device_classes": [], "rows": []})
            if device_class not in entry["device_classes"]:
                entry["device_classes"].append(device_class)
            decision = _latest_verdict(decisions, tier)
            entry["rows"].append(_row(artifact, _pick_run(runs), decision, promoted.get(tier) == artifact.sha256))
    return dict(sorted(tiers.items()))


def _outputs(registry: Registry, run: RunRecord, scratch: Path) -> dict[str, np.ndarray] | None:
    from tiergate.results import load_outputs

    if not run.result_key:
        return None
    folder = registry.fetch_result(run, scratch / f"run-{run.id}")
    try:
        return load_outputs(folder)
    except InputError:
        return None


def _pair(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray] | None) -> dict[str, float] | None:
    """Worst agreement over the outputs both sides share with the same shape; None when none do."""
    from tiergate.metrics.drift import compare_outputs

    if a is None or b is None:
        return None
    names = [n for n in sorted(set(a) & set(b)) if a[n].shape == b[n].shape]
    if not names:
        return None
    drifts = [compare_outputs(a[n], b[n]) for n in names]
    return {"max_abs_error": _number(max(d.max_abs_error for d in drifts)),
            "cosine": _number(min(d.cosine for d in drifts)), "sqnr_db": _number(min(d.sqnr_db for d in drifts))}


def cross_tier_matrix(registry: Registry, promoted: dict[str, str]) -> dict:
    """Pairwise drift between the promoted artifacts' outputs on every tier's device classes."""
    columns: list[dict] = []
    for tier, sha in sorted(promoted.items()):
        by_class: dict[str, list[RunRecord]] = {}
        for run in registry.runs(artifact_sha=sha):
            if run.tier == tier and run.ok:
                by_class.setdefault(run.device_class, []).append(run)
        for device_class, runs in sorted(by_class.items()):
            columns.append({"tier": tier, "device_class": device_class, "artifact_sha": sha, "run": runs[-1]})
    with tempfile.TemporaryDirectory(prefix="tiergate-report-") as scratch:
        outputs = [_outputs(registry, c["run"], Path(scratch)) for c in columns]
        cells = [[_pair(a, b) for b in outputs] for a in outputs]
    labels = [{"tier": c["tier"], "device_class": c["device_class"], "artifact_sha": c["artifact_sha"],
               "run_id": c["run"].id, "emulated": c["run"].emulated, "has_outputs": o is not None}
              for c, o in zip(columns, outputs)]
    return {key: [[cell[key] if cell else None for cell in row] for row in cells]
            for key in ("max_abs_error", "cosine", "sqnr_db")} | {"labels": labels}


def build_drift_report(registry: Registry, model: str, since: datetime | None = None) -> dict:
    """The whole report as a JSON-able dict; InputError when the model has no artifacts at all."""
    if model not in registry.models():
        known = ", ".join(registry.models()) or "none"
        raise InputError(f"model {model!r} has no registered artifacts (registered models: {known})")
    artifacts = registry.artifacts(model, since=since)
    promoted = registry.aliases(model)
    return {
        "schema": REPORT_SCHEMA,
        "model": model,
        "generated_at": _iso(datetime.now(timezone.utc)),
        "since": _iso(since) if since else None,
        "metric_keys": list(METRIC_KEYS),
        "artifacts": [{"sha256": a.sha256, "short": a.short, "registered_at": _iso(a.registered_at),
                       "format": a.format, "precision": a.precision, "parent_sha": a.parent_sha,
                       "reference_sha": a.reference_sha, "tags": a.tags} for a in artifacts],
        "promoted": promoted,
        "alias_history": [{"tier": m.tier, "artifact_sha": m.artifact_sha, "previous_sha": m.previous_sha,
                           "decision_id": m.decision_id, "moved_at": _iso(m.moved_at)}
                          for m in registry.alias_history(model)],
        "tiers": tier_rows(registry, artifacts, promoted),
        "cross_tier": cross_tier_matrix(registry, promoted),
    }
