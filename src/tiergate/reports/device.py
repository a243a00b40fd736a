"""The device figures of a decision as rows (CLI table, Markdown), and op-profile summaries.

One home for how the figures read: MB are MiB, times in ms, emulated runs labelled.
"""

from __future__ import annotations

from tiergate.decision import Decision, TargetMetrics
from tiergate.figures import MB, DeviceFigures, OpProfile

SIDES = ("candidate", "reference", "incumbent")
HEAD = ["peak MB", "load +MB", "inference +MB", "load ms", "first call ms", "size MB", "instructions/call",
        "load instructions"]


def _mb(value: int | None) -> str:
    return "—" if value is None else f"{value / MB:.1f}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def instructions(value: float | None) -> str:
    """A guest instruction count for people: 123.4M, 2.31G."""
    if value is None:
        return "—"
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{unit}"
    return f"{value:.0f}"


def counted(fig: DeviceFigures) -> str:
    """Instructions per call with the spread of the timed calls: 48.21M ±0.01%."""
    text = instructions(fig.instructions_per_inference)
    if fig.instructions_per_inference is not None and fig.instructions_spread is not None:
        text += f" ±{fig.instructions_spread / 2:.2%}"
    return text


def cells(fig: DeviceFigures) -> list[str]:
    size = "—" if fig.artifact_bytes is None else f"{fig.artifact_bytes / MB:.3g}"
    return [_mb(fig.peak_memory_bytes), _mb(fig.load_memory_bytes), _mb(fig.inference_memory_bytes),
            _ms(fig.load_ms), _ms(fig.first_inference_ms), size, counted(fig), instructions(fig.load_instructions)]


def top_ops_text(profile: OpProfile | None, n: int = 4) -> str:
    if profile is None:
        return ""
    if not profile.available:
        return f"unavailable: {profile.reason}"
    return ", ".join(f"{op} {ms:.3g}" for op, ms in profile.top_ops(n))


def device_rows(decision: Decision) -> list[dict]:
    """One row per device class and side that has figures."""
    rows = []
    for name, m in decision.metrics.items():
        for side in SIDES:
            fig = m.device.get(side)
            if fig is not None:
                rows.append({"device_class": name, "tier": m.tier, "side": side, "emulated": fig.emulated,
                             "cells": cells(fig), "top_ops": top_ops_text(fig.op_profile)})
    return rows


def ratio_text(m: TargetMetrics) -> str:
    return ", ".join(f"{key} {value:.3g}" for key, value in m.device_ratios.items())


def profile_summary(profile: dict | None, n: int = 5) -> dict | None:
    """{"available", "reason", "top": [[op, ms per call], ...]} from an op profile's JSON (registry detail)."""
    if not profile:
        return None
    if not profile.get("available"):
        return {"available": False, "reason": profile.get("reason", ""), "top": []}
    calls = max(int(profile.get("calls") or 1), 1)
    ranked = sorted(profile.get("by_op_type", {}).items(), key=lambda kv: -kv[1]["total_ms"])
    return {"available": True, "reason": "", "top": [[op, t["total_ms"] / calls] for op, t in ranked[:n]],
            "per_op": {op: t["total_ms"] / calls for op, t in ranked}}


def profile_changes(new: dict | None, old: dict | None, n: int = 5) -> list[dict]:
    """The op types whose time per call changed most between two profile summaries (new - old)."""
    if not new or not old or not new.get("available") or not old.get("available"):
        return []
    a, b = new.get("per_op", {}), old.get("per_op", {})
    changes = [{"op": op, "ms": a.get(op), "previous_ms": b.get(op),
                "change_ms": (a.get(op) or 0.0) - (b.get(op) or 0.0)} for op in set(a) | set(b)]
    changes.sort(key=lambda c: -abs(c["change_ms"]))
    return changes[:n]
