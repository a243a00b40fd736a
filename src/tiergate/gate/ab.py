"""A/B against the incumbent (the artifact promoted now) on one device class: non-inferior accuracy (Tango's score
interval on the discordant pairs, McNemar beside it) and latency (interleaved pairs where the run has them)."""

from __future__ import annotations

import dataclasses

from tiergate import stats
from tiergate.decision import ABResult, TargetMetrics
from tiergate.gate import timing
from tiergate.gate.common import class_labels, same_shape
from tiergate.metrics.accuracy import correct, predictions
from tiergate.npu import is_npu


def compare(ev, m: TargetMetrics, cand, ref, inc, labels) -> None:
    name = m.label_output
    if not inc.ok:
        ev.note(f"incumbent run failed ({inc.result.reason}); no A/B comparison")
        return
    if name is None or name not in m.outputs or not same_shape(inc, name, ref):
        ev.note("no classifier output shared with the incumbent; no A/B comparison")
        return
    truth = labels if class_labels(labels) else predictions(ref.outputs[name])
    basis = "labels" if class_labels(labels) else "agreement with FP32 top-1"
    ok_cand, ok_inc = correct(cand.outputs[name], truth), correct(inc.outputs[name], truth)
    conf, n_res = ev.t.confidence, ev.t.bootstrap_resamples
    diff = stats.accuracy_difference(ok_cand, ok_inc, confidence=conf, n_resamples=n_res, seed=ev.seed)
    mcnemar = stats.mcnemar_exact(ok_cand, ok_inc)
    m.ab = ABResult(basis, name, mcnemar, diff)
    margin = ev.t.noninferiority_margin     # an interval straddling -margin is INCONCLUSIVE, never a pass (issue 42)
    ev.interval_check("noninferior_accuracy", diff, ">=", -margin, len(ok_cand), output=name,
                      detail=f"candidate - incumbent ({basis}) = {diff.estimate:+.4f}, {conf:.0%} CI "
                             f"[{diff.low:+.4f}, {diff.high:+.4f}]; McNemar exact p = {mcnemar.p_value:.3g}",
                      needed_note="; about {needed} samples would decide it")
    ab_latency(ev, m, cand, inc)


def ab_latency(ev, m: TargetMetrics, cand, inc) -> None:
    """candidate / incumbent latency: from their interleaved calls on a native class (the median per-pair ratio),
    else the bootstrap of the two runs' mean latencies; non-inferior when its upper bound is within the margin,
    inferior when its lower bound is beyond it, else inconclusive."""
    if is_npu(ev.dc):                 # no time of the NPU's to compare (docs/npu.md)
        return
    a, b = cand.result.latencies_ns, inc.result.latencies_ns
    ratio, pairs = (None, 0) if m.emulated else timing.pairs_with(ev, cand, inc, "incumbent")
    if ratio is None:
        if len(a) < 2 or len(b) < 2:
            return
        ratio = stats.latency_ratio(a, b, confidence=ev.t.confidence, n_resamples=ev.t.bootstrap_resamples,
                                    seed=ev.seed)
    m.ab = dataclasses.replace(m.ab, latency_ratio=ratio)
    if m.emulated:
        return
    what = f"median of {pairs} interleaved call pairs" if pairs else "mean latency"
    ev.interval_check("noninferior_latency", ratio, "<=", 1 + ev.t.max_latency_regression, pairs or min(len(a), len(b)),
                      detail=f"candidate / incumbent {what} = {ratio.estimate:.3f}, "
                             f"{ratio.confidence:.0%} CI [{ratio.low:.3f}, {ratio.high:.3f}]",
                      needed_note="; about {needed} calls would decide it")
