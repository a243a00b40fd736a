"""The gate's checks on an NPU tier (docs/npu.md), called from gate.tier.TierEval.run for an ethos-u class.

What decides the tier: Vela's placement of the candidate's operators (min_npu_op_share, max_cpu_ops with
allowed_cpu_ops), its estimate against the FP32 reference's and the incumbent's (max_estimated_time_ratio,
max_estimated_time_ratio_vs_incumbent) and its memory (max_npu_sram_kib, max_npu_flash_kib); beside them the usual
numeric checks, on outputs computed by LiteRT's reference kernels (never a measurement of the NPU). Each run of the
tier carries Vela's record of its artifact (extra.npu, from vela-meta.json beside the model).
"""

from __future__ import annotations

from tiergate.npu.placement import Placement, describe, diff, diff_lines, location

NUMERICS = ("accuracy, drift and the A/B test on {name} are {numerics} on {machine} running the source model: the "
            "numeric model of the NPU's results (Arm's compiler is checked against the reference kernels; docs/npu.md), "
            "not a measurement of the NPU; its placement, time and memory are Vela {vela}'s compile and estimate")
NOT_TIMED = ("the host's time of the reference kernels is not the NPU's: no latency, cost, memory or load time is "
             "reported or gated on this tier (Vela's estimated time is: estimated_time_ratio)")


def placement_of(outcome) -> Placement | None:
    if outcome is None or not outcome.result.ok:
        return None
    return Placement.from_record((outcome.result.extra or {}).get("npu"))


def evaluate(te, m, cand, ref, inc) -> None:
    """The NPU checks of one ethos-u class into `te` (gate.tier.TierEval: its check, note, thresholds t, dc) and its
    figures into m.npu."""
    t, dc = te.t, te.dc
    mine, base, prev = placement_of(cand), placement_of(ref), placement_of(inc)
    spec = dc.compile
    m.npu = {side: p.to_json() for side, p in (("candidate", mine), ("reference", base), ("incumbent", prev)) if p}
    m.npu["numerics"] = spec.numerics if spec is not None else ""
    te.note(NUMERICS.format(name=dc.name, numerics=m.npu["numerics"], machine=dc.machine,
                            vela=dc.runtime_version))
    if not cand.ok:
        return
    if mine is None:
        te.check("npu_placement", "missing", "==", "present", passed=False,
                 detail="the candidate's run carries no Vela record (extra.npu): its placement is unknown")
        return
    if prev is not None:
        m.npu["diff"] = changes = diff(prev, mine)
        for line in diff_lines(changes):
            te.note(f"placement vs the incumbent: {line}")
    _share(te, t, mine)
    _cpu_ops(te, t, mine, m.npu.get("diff"))
    _time(te, t, mine, base, "estimated_time_ratio", t.max_estimated_time_ratio, "FP32 reference")
    if prev is not None:
        _time(te, t, mine, prev, "estimated_time_ratio_vs_incumbent", t.max_estimated_time_ratio_vs_incumbent,
              "incumbent")
    for name, value, limit, what in (("npu_sram_kib", mine.sram_kib, t.max_npu_sram_kib, "SRAM"),
                                     ("npu_flash_kib", mine.flash_kib, t.max_npu_flash_kib, "flash")):
        if limit is not None:
            te.check(name, value, "<=", limit, detail=f"{what} Vela allocates for the candidate on {dc.name} "
                     f"({mine.system_config}, {mine.memory_mode}), KiB" + ("" if value is not None else
                                                                          " (not in Vela's summary)"))


def _share(te, t, mine: Placement) -> None:
    if t.min_npu_op_share is None:
        return
    counted, on_cpu = mine.counted, mine.on_cpu
    detail = f"{len(mine.on_npu)} of {len(counted)} operators on the NPU"
    if mine.interface:
        detail += f" (the float interface on the CPU, not counted: {', '.join(location(op) for op in mine.interface)})"
    if on_cpu:
        detail += f"; on the CPU: {'; '.join(describe(op) for op in on_cpu)}"
    te.check("npu_op_share", mine.share if mine.share is not None else 0.0, ">=", t.min_npu_op_share, detail=detail)


def _cpu_ops(te, t, mine: Placement, changes: dict | None) -> None:
    if t.max_cpu_ops is None:
        return
    allowed = set(t.allowed_cpu_ops)
    counted = [op for op in mine.on_cpu if str(op.get("op", "")).upper() not in allowed]
    if counted:
        detail = f"on the CPU: {'; '.join(describe(op) for op in counted)}"
    else:
        detail = "no operator falls back to the CPU"
    skipped = len(mine.on_cpu) - len(counted)
    if skipped:
        detail += f" ({skipped} of the allowed types {', '.join(sorted(allowed))} not counted)"
    moved = (changes or {}).get("to_cpu", []) + (changes or {}).get("new_on_cpu", [])
    if moved:
        detail += f"; vs the incumbent: {'; '.join(moved)}"
    te.check("cpu_ops", len(counted), "<=", t.max_cpu_ops, detail=detail)


def _time(te, t, mine: Placement, other: Placement | None, name: str, limit, who: str) -> None:
    if limit is None:
        return
    if other is None or other.estimated_us is None:
        te.note(f"{name} not applied: the {who} has no NPU work in Vela's estimate"
                + ("" if other is None else f" ({len(other.on_cpu)} operators on the CPU)"))
        return
    value = mine.estimated_us / other.estimated_us if mine.estimated_us is not None else None
    detail = (f"Vela's estimate, candidate {_us(mine.estimated_us)} / {who} {_us(other.estimated_us)} "
              f"({mine.cycles or 0:.0f} / {other.cycles or 0:.0f} cycles at {mine.summary.get('core_clock', 0) / 1e6:g} "
              "MHz)")
    extra = len(mine.on_cpu) - len(other.on_cpu)
    if extra > 0:
        detail += (f"; a lower bound: the candidate has {extra} more operator(s) on the CPU, whose time Vela does "
                   "not estimate")
    if value is None:
        detail += "; the candidate has no NPU work"
    te.check(name, value, "<=", limit, detail=detail)


def _us(value: float | None) -> str:
    return "no NPU work" if value is None else f"{value:.1f} us"
