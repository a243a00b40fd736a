"""The drift report's data, read from the registry: per tier, how each registered artifact did on each
device class over time, and the cross-tier drift matrix of the currently promoted artifacts.

Run metrics use the flat shape documented in docs/registry.md (`METRIC_KEYS`, plus "emulated";
tiergate.registry.gate_link). The cross-tier matrix is computed (tiergate.reports.drift) from the
stored result folders (outputs.npz) of the promoted artifacts' runs. Each artifact is named by its
registered version (`version_of`) and its family (`family_of`); every recorded decision of the
artifacts is in it (checks, reasons, lineage) with the explanation recorded for it, if any
(`Registry.explanations`: gate --explain --registry, the demo). The result is a JSON-able dict
(see `build_drift_report`); tiergate.reports.html renders it.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from tiergate.errors import InputError
from tiergate.registry.db import Registry
from tiergate.registry.gate_link import METRIC_KEYS
from tiergate.registry.records import ArtifactRecord, DecisionRecord, RunRecord
from tiergate.reports.drift import REPORT_SCHEMA, cross_tier_matrix, finite
from tiergate.results import load_outputs

_ALIASES = {"max_abs_err": "max_abs_error"}  # accepted spellings in recorded run metrics


def report_metrics(metrics: dict[str, Any]) -> dict[str, float | None]:
    """A recorded run's metrics on the report's keys (METRIC_KEYS); missing or non-finite values become None."""
    named = {_ALIASES.get(k, k): v for k, v in metrics.items()}
    return {key: finite(named.get(key)) for key in METRIC_KEYS}


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def _pick_run(runs: list[RunRecord]) -> RunRecord:
    """The latest successful run, else the latest run."""
    ok = [r for r in runs if r.ok]
    return (ok or runs)[-1]


def _latest_verdict(decisions: list[DecisionRecord], tier: str) -> DecisionRecord | None:
    matching = [d for d in decisions if tier in d.tiers]
    return matching[-1] if matching else None


def _interval(value, low, high, confidence) -> dict | None:
    bounds = [finite(v) for v in (value, low, high)]
    if any(b is None for b in bounds):
        return None
    return {"value": bounds[0], "low": bounds[1], "high": bounds[2], "confidence": finite(confidence)}


def recorded_intervals(detail: dict[str, Any], device_class: str) -> dict:
    """From a recorded decision (its Decision JSON): the device class's accuracy and task-metric intervals.

    {"accuracy": {"value", "low", "high", "confidence", "n"} | None (the candidate's top-1 accuracy),
     "checks": [{"label", "value", "low", "high", "confidence", "op", "threshold", "outcome",
                 "samples_needed"}, ...] (every check judged on an interval)}
    """
    metrics = (detail.get("metrics") or {}).get(device_class) or {}
    acc = (metrics.get("accuracy") or {}).get("candidate")
    accuracy = None
    if isinstance(acc, dict):
        accuracy = _interval(acc.get("value"), acc.get("low"), acc.get("high"), acc.get("confidence"))
        if accuracy is not None:
            accuracy["n"] = acc.get("n")
    checks = []
    for check in detail.get("checks") or []:
        interval = check.get("interval")
        if check.get("device_class") != device_class or not isinstance(interval, dict):
            continue
        bounds = _interval(interval.get("estimate"), interval.get("low"), interval.get("high"),
                           interval.get("confidence"))
        if bounds is None:
            continue
        outcome = "pass" if check.get("passed") else ("inconclusive" if check.get("inconclusive") else "fail")
        checks.append({"label": check.get("label") or check.get("name"), **bounds, "op": check.get("op"),
                       "threshold": check.get("threshold"), "outcome": outcome,
                       "samples_needed": check.get("samples_needed")})
    return {"accuracy": accuracy, "checks": checks}


VERSION_TAG = "version"                 # an artifact's own version, as registered (`register --tag version=1.4`)
MLFLOW_VERSION_TAG = "mlflow.version"   # the MLflow model version it came from (MLflow lineage tags)
FAMILY_TAG = "family"                   # overrides the family (default "<precision>/<format>")


def version_of(artifact: ArtifactRecord, ordinal: int) -> tuple[str, str]:
    """(version label, where it came from): the artifact's `version` tag ("tag"), else its MLflow model
    version ("mlflow": "mlflow v3"), else its registration ordinal within the model ("ordinal": "v3")."""
    tags = artifact.tags or {}
    if str(tags.get(VERSION_TAG) or "").strip():
        return str(tags[VERSION_TAG]).strip(), "tag"
    if str(tags.get(MLFLOW_VERSION_TAG) or "").strip():
        return f"mlflow v{str(tags[MLFLOW_VERSION_TAG]).strip()}", "mlflow"
    return f"v{ordinal}", "ordinal"


def family_of(artifact: ArtifactRecord) -> str:
    """The line an artifact belongs to in the plots: its `family` tag, else "<precision>/<format>"."""
    return str((artifact.tags or {}).get(FAMILY_TAG) or f"{artifact.precision}/{artifact.format}")


def artifact_entries(all_artifacts: list[ArtifactRecord], shown: list[ArtifactRecord]) -> list[dict]:
    """The shown artifacts (oldest first) with their version, family and `label`: the version, made unique
    within a family by the hash prefix (two artifacts of one family tagged the same version)."""
    ordinal = {a.sha256: i for i, a in enumerate(all_artifacts, start=1)}   # over the model, not `since`
    out, seen = [], set()
    for a in shown:
        version, source = version_of(a, ordinal.get(a.sha256, 0))
        family = family_of(a)
        label = version if (family, version) not in seen else f"{version} ({a.short[:6]})"
        seen.add((family, version))
        out.append({"sha256": a.sha256, "short": a.short, "registered_at": _iso(a.registered_at),
                    "format": a.format, "precision": a.precision, "parent_sha": a.parent_sha,
                    "reference_sha": a.reference_sha, "tags": a.tags, "version": version,
                    "version_source": source, "ordinal": ordinal.get(a.sha256), "family": family, "label": label})
    return out


def _check(check) -> dict:
    return {"device_class": check.device_class, "tier": check.tier, "name": check.name, "label": check.label,
            "output": check.output, "value": _json_value(check.value), "op": check.op,
            "threshold": _json_value(check.threshold), "outcome": check.outcome, "detail": check.detail or ""}


def _json_value(value):
    return value if not isinstance(value, float) or finite(value) is not None else str(value)


def decision_entries(registry: Registry, artifacts: list[dict], explained: set[int]) -> list[dict]:
    """Every recorded decision of the given artifacts (report["artifacts"] entries), oldest first:
    verdict, tiers, reasons, checks, the runs it used, the artifact's lineage and reference."""
    by_sha = {a["sha256"]: a for a in artifacts}
    out = []
    for entry in artifacts:
        lineage = [{"sha256": a.sha256, "short": a.short, "model": a.model, "format": a.format,
                    "precision": a.precision, "registered_at": _iso(a.registered_at), "tags": a.tags,
                    "version": by_sha[a.sha256]["label"] if a.sha256 in by_sha else None}
                   for a in registry.lineage(entry["sha256"])]
        reference = registry.find_artifact(entry["reference_sha"]) if entry["reference_sha"] else None
        for d in registry.decisions(artifact_sha=entry["sha256"]):
            out.append({
                "id": d.id, "artifact_sha": d.artifact_sha, "short": entry["short"], "label": entry["label"],
                "family": entry["family"], "verdict": d.verdict, "tiers": list(d.tiers), "reasons": list(d.reasons),
                "decided_at": _iso(d.decided_at), "cost_tags": d.cost_tags, "run_ids": list(d.run_ids),
                "checks": [_check(c) for c in d.checks], "lineage": lineage,
                "reference": None if reference is None else {
                    "sha256": reference.sha256, "short": reference.short, "precision": reference.precision,
                    "format": reference.format,
                    "version": by_sha[reference.sha256]["label"] if reference.sha256 in by_sha else None},
                "explained": d.id in explained,
                # NPU tiers: the candidate's placement and Vela's estimate per device class (docs/npu.md)
                "npu": {name: graph["npu"] for name, graph in (d.detail.get("runtime") or {}).items()
                        if isinstance(graph, dict) and graph.get("npu")},
            })
    return out


def verdict_matrix(artifacts: list[dict], decisions: list[dict], tiers: list[str]) -> dict:
    """Versions x tiers: per artifact and tier, the latest decision covering the tier (None: not gated)
    with the labels of its failing checks on that tier, and `stopped` (why, or ""): the tier was stopped
    unjudged by an early decision, another tier's REJECT being final."""
    names = sorted(set(tiers) | {t for d in decisions for t in d["tiers"]})
    rows = []
    for a in artifacts:
        cells = {}
        for tier in names:
            covering = [d for d in decisions if d["artifact_sha"] == a["sha256"] and tier in d["tiers"]]
            d = covering[-1] if covering else None
            stopped = None if d is None else next(
                (c for c in d["checks"] if c["tier"] == tier and c["name"] == "stopped"), None)
            cells[tier] = None if d is None else {
                "decision_id": d["id"], "verdict": d["verdict"], "explained": d["explained"],
                "failed": [c["label"] for c in d["checks"] if c["tier"] == tier and c["outcome"] == "fail"],
                # an early decision stopped this tier unjudged: another tier's REJECT was final
                "stopped": stopped["detail"] if stopped is not None else "",
                # an NPU tier: the candidate's share on the NPU and Vela's estimate
                "npu": next((s for s in (d.get("npu") or {}).values() if s.get("tier") == tier), None)}
        rows.append({"artifact_sha": a["sha256"], "label": a["label"], "family": a["family"], "cells": cells})
    return {"tiers": names, "rows": rows}


def npu_over_versions(artifacts: list[dict], decisions: list[dict]) -> list[dict]:
    """Per NPU device class and version (oldest first), from the version's latest decision on it: the share of its
    operators on the NPU, the operators on the CPU, Vela's estimated time and memory (docs/npu.md)."""
    rows = []
    for a in artifacts:
        latest: dict[str, tuple[dict, dict]] = {}
        for d in decisions:
            if d["artifact_sha"] == a["sha256"]:
                for name, summary in (d.get("npu") or {}).items():
                    latest[name] = (d, summary)
        for name, (d, s) in sorted(latest.items()):
            rows.append({"artifact_sha": a["sha256"], "label": a["label"], "device_class": name,
                         "tier": s.get("tier", ""), "decision_id": d["id"], "verdict": d["verdict"],
                         "npu_op_share": s.get("npu_op_share"), "npu_ops": s.get("npu_ops"),
                         "cpu_ops": s.get("cpu_ops"), "counted": s.get("counted"), "cpu": s.get("cpu", []),
                         "estimated_us": s.get("estimated_us"), "cycles": s.get("cycles"),
                         "sram_kib": s.get("sram_kib"), "flash_kib": s.get("flash_kib")})
    return rows


def _row(artifact: ArtifactRecord, run: RunRecord, decision: DecisionRecord | None, promoted: bool) -> dict:
    return {
        "artifact_sha": artifact.sha256, "short": artifact.short, "registered_at": _iso(artifact.registered_at),
        "precision": artifact.precision, "format": artifact.format, "tags": artifact.tags,
        "device_class": run.device_class, "run_id": run.id, "status": run.status,
        "emulated": bool(run.metrics.get("emulated", run.emulated)), "machine": run.machine,
        "metrics": report_metrics(run.metrics),
        "decision": decision.verdict if decision else None,
        "decision_id": decision.id if decision else None,
        "reasons": decision.reasons if decision else [],
        "intervals": recorded_intervals(decision.detail, run.device_class) if decision
        else {"accuracy": None, "checks": []},
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
    if not run.result_key:
        return None
    folder = registry.fetch_result(run, scratch / f"run-{run.id}")
    try:
        return load_outputs(folder)
    except InputError:
        return None


def promoted_cross_tier(registry: Registry, promoted: dict[str, str]) -> dict:
    """The cross-tier matrix over the promoted artifacts' latest successful run on every tier's device classes."""
    columns: list[tuple[dict, RunRecord]] = []
    for tier, sha in sorted(promoted.items()):
        by_class: dict[str, list[RunRecord]] = {}
        for run in registry.runs(artifact_sha=sha):
            if run.tier == tier and run.ok:
                by_class.setdefault(run.device_class, []).append(run)
        for device_class, runs in sorted(by_class.items()):
            run = runs[-1]
            columns.append(({"tier": tier, "device_class": device_class, "artifact_sha": sha,
                             "run_id": run.id, "emulated": run.emulated}, run))
    with tempfile.TemporaryDirectory(prefix="tiergate-report-") as scratch:
        outputs = [_outputs(registry, run, Path(scratch)) for _, run in columns]
    return cross_tier_matrix([label for label, _ in columns], outputs)


def build_drift_report(registry: Registry, model: str, since: datetime | None = None) -> dict:
    """The whole report as a JSON-able dict; InputError when the model has no artifacts at all."""
    if model not in registry.models():
        known = ", ".join(registry.models()) or "none"
        raise InputError(f"model {model!r} has no registered artifacts (registered models: {known})")
    artifacts = registry.artifacts(model, since=since)
    entries = artifact_entries(registry.artifacts(model), artifacts)
    promoted = registry.aliases(model)
    tiers = tier_rows(registry, artifacts, promoted)
    named = {e["sha256"]: e for e in entries}
    for entry in tiers.values():
        for row in entry["rows"]:
            row.update(version=named[row["artifact_sha"]]["version"], label=named[row["artifact_sha"]]["label"],
                       family=named[row["artifact_sha"]]["family"])
    ids = [d.id for a in artifacts for d in registry.decisions(artifact_sha=a.sha256)]
    explanations = registry.explanations(ids) if ids else {}
    decisions = decision_entries(registry, entries, set(explanations))
    return {
        "schema": REPORT_SCHEMA,
        "model": model,
        "generated_at": _iso(datetime.now(timezone.utc)),
        "since": _iso(since) if since else None,
        "metric_keys": list(METRIC_KEYS),
        "artifacts": entries,
        "promoted": promoted,
        "alias_history": [{"tier": m.tier, "artifact_sha": m.artifact_sha, "previous_sha": m.previous_sha,
                           "decision_id": m.decision_id, "moved_at": _iso(m.moved_at)}
                          for m in registry.alias_history(model)],
        "tiers": tiers,
        "decisions": decisions,
        "verdicts": verdict_matrix(entries, decisions, list(tiers)),
        "npu": npu_over_versions(entries, decisions),
        "explanations": {str(k): v for k, v in sorted(explanations.items())},
        "cross_tier": promoted_cross_tier(registry, promoted),
        "runtime": runtime_graphs(registry, artifacts),
        "ops": op_profiles(registry, artifacts),
    }


def op_profiles(registry: Registry, artifacts: list[ArtifactRecord]) -> dict[str, list[dict]]:
    """tier -> per device class: the top ops of the latest artifact whose gate profiled it (gate --profile),
    and what changed since the artifact profiled before it (from the recorded decisions' device figures)."""
    from tiergate.reports.device import profile_changes, profile_summary

    seen: dict[tuple[str, str], list[dict]] = {}
    for artifact in artifacts:
        recorded = registry.decisions(artifact_sha=artifact.sha256)
        if not recorded:
            continue
        for name, target in (recorded[-1].detail.get("metrics") or {}).items():
            figures = ((target.get("device") or {}).get("candidate") or {})
            summary = profile_summary(figures.get("op_profile"))
            if summary is not None:
                seen.setdefault((target.get("tier", ""), name), []).append(
                    {"short": artifact.short, "artifact_sha": artifact.sha256, "profile": summary,
                     "emulated": bool(target.get("emulated"))})
    out: dict[str, list[dict]] = {}
    for (tier, name), history in sorted(seen.items()):
        latest, previous = history[-1], (history[-2] if len(history) > 1 else None)
        out.setdefault(tier, []).append({
            "device_class": name, **latest,
            "previous_short": previous["short"] if previous else None,
            "changes": profile_changes(latest["profile"], previous["profile"] if previous else None)})
    return out


def runtime_graphs(registry: Registry, artifacts: list[ArtifactRecord]) -> list[dict]:
    """Per artifact (oldest first), what each device class's runtime executed of it, from its last gate."""
    out = []
    for artifact in artifacts:
        recorded = [d for d in registry.decisions(artifact_sha=artifact.sha256) if d.detail.get("runtime")]
        if recorded:
            out.append({"artifact_sha": artifact.sha256, "short": artifact.short,
                        "device_classes": recorded[-1].detail["runtime"]})
    return out
