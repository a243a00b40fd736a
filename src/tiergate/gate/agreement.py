"""Agreement of the candidate's outputs with the FP32 reference's: presence, shape, finiteness, then the
agreement limits (cosine, SQNR, top-1 agreement, relative L2, largest error, KL divergence) for every candidate,
float or quantized; an output whose kind has parts (a detector's boxes and scores in one tensor) is judged part
by part (`NAME:PART`), never as one number over values that mean different things."""

from __future__ import annotations

from tiergate.decision import TargetMetrics
from tiergate.gate.common import compare, fmt
from tiergate.metrics.drift import OutputDrift, compare_outputs, non_finite_count
from tiergate.outputs.decode import parts

AGREEMENT_CHECKS = ("cosine", "sqnr_db", "top1_agreement", "relative_l2", "max_abs_error", "kl_divergence")


def outputs(ev, m: TargetMetrics, cand: dict, ref: dict) -> dict[str, OutputDrift]:
    for name, ref_out in ref.items():
        out = cand.get(name)
        if out is None:
            ev.check("output_present", "missing", "==", "present", output=name, passed=False,
                     detail=f"candidate outputs: {', '.join(cand) or 'none'}")
            continue
        if out.shape != ref_out.shape:
            ev.check("output_shape", str(out.shape), "==", str(ref_out.shape), output=name, passed=False)
            continue
        m.outputs[name] = drift = compare_outputs(ref_out, out)
        ev.check("finite", drift.non_finite, "==", 0, output=name,
                 detail="NaN or Inf in the candidate's output" if drift.non_finite else "")
        ref_bad = non_finite_count(ref_out)
        ev.check("reference_finite", ref_bad, "==", 0, output=name,
                 detail="NaN or Inf in the FP32 reference's output" if ref_bad else "")
    for name in cand:
        if name not in ref:
            ev.note(f"candidate output '{name}' has no FP32 reference counterpart; not compared")
    judged = dict(m.outputs)
    for name in list(judged):
        kind = ev.kinds.get(name)
        split = parts(kind, ref[name]) if kind is not None else {}
        if not split:
            continue
        mine = parts(kind, cand[name])
        del judged[name]                 # its parts are judged apart: they mean different things
        for part, ref_part in split.items():
            m.outputs[f"{name}:{part}"] = judged[f"{name}:{part}"] = compare_outputs(ref_part, mine[part])
    return judged


def drift_checks(ev, name: str, drift: OutputDrift) -> None:
    t = ev.t
    limits = [("top1_agreement", ">=", t.min_top1_agreement), ("relative_l2", "<=", t.max_relative_l2),
              ("max_abs_error", "<=", t.max_abs_error), ("kl_divergence", "<=", t.max_kl_divergence)]
    limits = [("cosine", ">=", t.min_cosine), ("sqnr_db", ">=", t.min_sqnr_db)] + limits     # every candidate
    for metric, op, threshold in limits:
        if threshold is None:
            continue
        value = getattr(drift, metric)
        if value is None:
            ev.note(f"{metric} limit not applied to output '{name}' (not a "
                    f"{'probability' if metric == 'kl_divergence' else 'classifier'} output)")
            continue
        if ev.agreement_gates:
            ev.check(metric, value, op, threshold, output=name)
        elif not compare(value, op, threshold):
            ev.warnings.append(f"{ev.dc.name}: {metric}[{name}] is {fmt(value)}, the limit is {op} "
                               f"{fmt(threshold)} (evidence only: task metrics decide; policy "
                               "agreement = \"gate\" makes it a check)")
