"""Latency and cost of one device class: per-call statistics, the candidate / reference ratio from interleaved call
pairs (native classes) or the runs' means, the latency limits, cost per 1,000 inferences on real hardware only."""

from __future__ import annotations

import math

from tiergate import stats
from tiergate.decision import TargetMetrics
from tiergate.gate.common import compare, untrusted
from tiergate.metrics.cost import cost_per_1k
from tiergate.metrics.latency import LatencyStats, latency_stats
from tiergate.npu import checks as npu_checks, is_npu


def latency(ev, m: TargetMetrics, cand, ref, inc) -> None:
    if is_npu(ev.dc):                 # the reference kernels' time on this host is not the NPU's
        ev.note(npu_checks.NOT_TIMED)
        return
    for side, outcome in (("candidate", cand), ("reference", ref), ("incumbent", inc)):
        if outcome is not None and outcome.result.ok:
            stats_ = latency_stats(outcome.result.latencies_ns, outcome.result.batch_size or 1,
                                   emulated=m.emulated, max_cov=ev.t.max_latency_cov,
                                   min_samples_p99=ev.t.p99_min_samples)
            if stats_ is not None:
                m.latency[side] = stats_
    lat, base = m.latency.get("candidate"), m.latency.get("reference")
    if lat and base:
        m.latency_ratio_vs_reference = lat.mean_ms / base.mean_ms if base.mean_ms > 0 else math.nan
    if not m.emulated and cand.result.ok:
        interleaved(ev, m, cand, ref)
    if lat and lat.unstable:
        ev.note(f"candidate latency is unstable (CoV {lat.cov:.2f} > {ev.t.max_latency_cov}); "
                "reported, not trusted" + ("; its ratio to the reference is from interleaved call pairs"
                                           if m.latency_ratio_interval is not None else ""))
    if m.emulated:
        if lat:
            how_ = cand.result.extra.get("evaluation") or {}
            how = (f"; timed on {how_['latency_calls']} calls, outputs in calls of {how_['eval_batch']} samples "
                   f"(checked equal to single calls)" if how_.get("batched") else "")
            ev.note("latency is emulated (QEMU): reported, used only relative to the FP32 reference, "
                    f"not gated; no cost computed{how}")
        return
    if cand.ok:
        latency_checks(ev, m, lat)
    cost(ev, m, cand.ok)


def interleaved(ev, m: TargetMetrics, cand, ref) -> None:
    """candidate / reference latency from the candidate's calls interleaved with the reference's in one process
    (extra.paired, harness_paired.py): the median per-pair ratio and its interval; a noisy host slows both
    calls of a pair, so this ratio holds where two loops' means do not."""
    interval, n = pairs_with(ev, cand, ref, "reference")
    if interval is not None:
        m.latency_ratio_vs_reference, m.latency_ratio_interval, m.latency_pairs = interval.estimate, interval, n


def pairs_with(ev, cand, other, who: str):
    """(interval of candidate / `other` from their interleaved calls, pairs), or (None, 0) with a note saying
    why the ratio falls back to the runs' means."""
    paired = cand.result.extra.get("paired")
    if not isinstance(paired, dict):
        return None, 0
    if paired.get("error"):
        text = f"interleaved latency failed ({paired['error']}); latency ratios are of the runs' means"
        if f"{ev.dc.name}: {text}" not in ev.notes:
            ev.note(text)
        return None, 0
    sha = other.result.artifact_sha256
    if sha and sha == cand.result.artifact_sha256:      # the same file: never paired, its ratio is 1
        return None, 0
    mine = paired.get("latencies_ns") or []
    theirs = next((p.get("latencies_ns") or [] for p in paired.get("partners") or []
                   if isinstance(p, dict) and sha and p.get("sha256") == sha), None)
    if theirs is None or not mine or len(mine) != len(theirs):
        ev.note(f"the candidate's interleaved calls are not with this {who}; the latency ratio to it is of "
                "the runs' means")
        return None, 0
    return stats.interleaved_latency_ratio(mine, theirs, confidence=ev.t.confidence), len(mine)


def cost(ev, m: TargetMetrics, candidate_ok: bool) -> None:
    """Cost per 1,000 inferences on real hardware only (never from emulated latency)."""
    for side in ("candidate", "reference"):
        if side in m.latency:
            m.cost_per_1k[side] = cost_per_1k(ev.dc.cost_per_hour, m.latency[side].throughput_per_s)
    if ev.t.max_cost_per_1k is not None and candidate_ok:
        ev.check("cost_per_1k", m.cost_per_1k.get("candidate"), "<=", ev.t.max_cost_per_1k,
                 detail=f"{ev.dc.cost_per_hour}/h at measured single-stream throughput")


def latency_checks(ev, m: TargetMetrics, lat: LatencyStats | None) -> None:
    limits = [("latency_p50_ms", ev.t.max_latency_p50_ms), ("latency_p90_ms", ev.t.max_latency_p90_ms),
              ("latency_p99_ms", ev.t.max_latency_p99_ms), ("latency_ratio", ev.t.max_latency_ratio)]
    for name, limit in limits:
        if limit is None:
            continue
        if name == "latency_ratio" and m.latency_ratio_interval is not None:
            interleaved_check(ev, m, limit)
            continue
        value = m.latency_ratio_vs_reference if name == "latency_ratio" else \
            (getattr(lat, name.removeprefix("latency_")) if lat else None)
        why = untrusted(lat, name, ev.t)
        ev.check(name, value, "<=", limit, passed=compare(value, "<=", limit) and not why,
                 detail=why or ("no latency measurements" if lat is None else ""))


def interleaved_check(ev, m: TargetMetrics, limit: float) -> None:
    """max_latency_ratio on the interleaved pairs' interval, as a task metric is: pass when all of it is at
    or under the limit, fail when all of it is over, else inconclusive with the pairs needed."""
    interval, n = m.latency_ratio_interval, m.latency_pairs
    ev.interval_check("latency_ratio", interval, "<=", limit, n,
                         f"candidate / FP32 reference per interleaved call pair, median of {n} pairs, "
                         f"{interval.confidence:.0%} CI [{interval.low:.3f}, {interval.high:.3f}]",
                         needed_note="; about {needed} pairs would decide it ([evaluation] latency_pairs)")
