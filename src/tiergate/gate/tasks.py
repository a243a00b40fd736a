"""Task metrics, candidate against the FP32 reference on the same tier, each judged on its interval: top-1
accuracy (score interval on the discordant pairs), the built-in metrics and the user's (paired bootstrap)."""

from __future__ import annotations

import time

import numpy as np

from tiergate import stats
from tiergate.decision import TargetMetrics
from tiergate.gate.common import check_labels_fit, pct, same_shape, task_threshold
from tiergate.metrics.accuracy import accuracy as accuracy_of, correct
from tiergate.errors import InputError
from tiergate.metrics.task import MetricSpec, Prepared, value as task_value

# the metrics judged by score intervals on their discordant pairs (stats.paired_interval): no bootstrap, so a gate
# of these alone never loads scipy.stats (orchestrator.deciding.bootstraps)
PAIRED_METRICS = ("top1", "topk")


def accuracy(ev, m: TargetMetrics, cand, ref, inc, labels) -> None:
    name, conf = m.label_output, ev.t.confidence
    check_labels_fit(labels, ref.outputs[name], name)
    if name not in m.outputs:          # missing or misshapen in the candidate: already failed
        return
    m.accuracy["candidate"] = acc = accuracy_of(cand.outputs[name], labels, conf)
    m.accuracy["reference"] = base = accuracy_of(ref.outputs[name], labels, conf)
    if inc is not None and inc.ok and same_shape(inc, name, ref):
        m.accuracy["incumbent"] = accuracy_of(inc.outputs[name], labels, conf)
    top1 = next((s for s in ev.specs if s.kind == "top1"), None)
    if top1 is None:
        return
    threshold = top1.min_ratio if top1.min_ratio is not None else ev.t.min_accuracy_ratio
    hits_c, hits_r = correct(cand.outputs[name], labels), correct(ref.outputs[name], labels)
    counts = stats.pair_counts(hits_c, hits_r)
    interval = stats.paired_interval(counts, "ratio", conf)
    mcnemar = stats.mcnemar_exact(hits_c, hits_r)
    detail = (f"candidate {pct(acc)} vs FP32 {pct(base)}; {mcnemar.only_a} samples only the candidate "
              f"gets right, {mcnemar.only_b} only FP32, McNemar exact p = {mcnemar.p_value:.3g}")
    ev.judged(m, top1, "accuracy_ratio", name, len(labels), acc.value, base.value, interval, ">=",
              threshold, detail, counts=counts)


def task_metrics(ev, m: TargetMetrics, cand, ref, labels) -> None:
    from tiergate.metrics import task

    for spec in ev.specs:
        if spec.kind == "top1" or spec.kind in task.KIND_METRICS:      # the kinds' metrics: kind_metrics
            continue
        if labels is None and spec.kind != "custom":
            ev.note(f"metric {spec.name} needs labels; not computed")
            continue
        if spec.kind == "custom":
            custom_metric(ev, m, spec, cand.outputs, ref.outputs, labels)
            continue
        name = task.pick_output(spec, ref.outputs, labels, m.label_output)
        if name is None or name not in m.outputs:
            ev.note(f"metric {spec.name}: no comparable output; not computed")
            continue
        a, b = task.prepare(spec, cand.outputs[name], labels), task.prepare(spec, ref.outputs[name], labels)
        counts = stats.pair_counts(a.components[0], b.components[0]) if spec.kind == "topk" else None
        difference = spec.max_drop is not None
        interval = stats.paired_interval(counts, "ratio", ev.t.confidence) if counts else \
            stats.metric_ratio(a.components, b.components, a.statistic, confidence=ev.t.confidence,
                               n_resamples=ev.t.bootstrap_resamples, seed=ev.seed, difference=difference)
        op, threshold = task_threshold(spec, ev.t.min_accuracy_ratio)
        ev.judged(m, spec, f"{spec.name}_{'difference' if difference else 'ratio'}", name, len(labels),
                  task.value(a), task.value(b), interval, op, threshold,
                  f"candidate {task.value(a):.4g} vs FP32 {task.value(b):.4g}", counts=counts)


def custom_metric(ev, m: TargetMetrics, spec: MetricSpec, cand: dict, ref: dict, labels) -> None:
    """A user metric (--metric FILE.py:FUNCTION), called on each side's whole outputs on one thread of its own. Per-
    sample values back (metrics.task.custom_result): the interval comes from them, as a built-in metric's (one
    pass over the data); one number back: it is called again per bootstrap resample, within the policy's
    `user_metric_budget_s` (stats.whole_set_ratio), its progress shown."""
    from tiergate import usercode
    from tiergate.metrics.task import custom_name, custom_result, custom_value, refuse_ratio_of_nonpositive

    n = len(next(iter(ref.values())))
    if any(len(v) != n for v in (*cand.values(), *ref.values())):
        ev.note(f"metric {spec.name}: outputs differ in sample count; not computed")
        return
    difference = spec.max_drop is not None
    op, threshold = task_threshold(spec, ev.t.min_accuracy_ratio)
    key = f"{spec.name}_{'difference' if difference else 'ratio'}"
    with usercode.Worker(custom_name(spec)) as worker:
        t0 = time.perf_counter()
        sides = [custom_result(spec, worker.call(spec.fn, outputs, labels), n) for outputs in (cand, ref)]
        first_s = time.perf_counter() - t0
        if all(isinstance(side, Prepared) for side in sides):
            a, b = sides
            values = {"candidate": task_value(a), "reference": task_value(b)}
            if not difference:       # a negative sample's value (hence a negative resample) is refused as well
                refuse_ratio_of_nonpositive(spec, {side: min(float(p.components[0].min()), 0.0) or values[side]
                                                   for side, p in zip(values, sides)})
            interval = stats.metric_ratio(a.components, b.components, a.statistic, confidence=ev.t.confidence,
                                          n_resamples=ev.t.bootstrap_resamples, seed=ev.seed, difference=difference)
            ev.judged(m, spec, key, None, n, values["candidate"], values["reference"], interval, op, threshold,
                      f"candidate {values['candidate']:.4g} vs FP32 {values['reference']:.4g} ({spec.source}; "
                      f"per-sample values)")
            return
        if any(isinstance(side, Prepared) for side in sides):
            raise InputError(f"{custom_name(spec)}: returned per-sample values for one side and one number for the "
                             "other; it must return the same form for every call")

        def pair(idx):
            lab = None if labels is None else labels[idx]
            values = (custom_value(spec, {k: v[idx] for k, v in cand.items()}, lab, worker),
                      custom_value(spec, {k: v[idx] for k, v in ref.items()}, lab, worker))
            if not difference:       # a user metric's range is unknown: a ratio only of positive values
                refuse_ratio_of_nonpositive(spec, dict(zip(("candidate", "reference"), values)))
            return values

        if not difference:
            refuse_ratio_of_nonpositive(spec, dict(zip(("candidate", "reference"), sides)))
        budget = ev.t.user_metric_budget_s

        def progress(done, planned, seconds):
            usercode.report(f"{ev.dc.name}: metric {spec.name}: bootstrap {done} of {planned} resamples "
                            f"({seconds:.0f} s of its budget of {budget:g} s)")
        interval = stats.whole_set_ratio(n, pair, tuple(sides), confidence=ev.t.confidence,
                                         n_resamples=ev.t.bootstrap_resamples, seed=ev.seed, difference=difference,
                                         budget_s=budget, first_s=first_s, progress=progress)
    detail = f"candidate {sides[0]:.4g} vs FP32 {sides[1]:.4g} ({spec.source}; one number for the whole set"
    if interval.method.startswith(stats.OVER_BUDGET):
        detail += (f": {interval.method.split(': ', 1)[1]}; return per-sample values to have its interval at the "
                   "cost of one call, or raise user_metric_budget_s (docs/policy.md)")
    ev.judged(m, spec, key, None, n, sides[0], sides[1], interval, op, threshold, detail + ")")


# -- the output kinds' own metrics (tiergate.metrics.kinds), against labels or FP32's decoded outputs -------
KIND_RESAMPLES = 999       # average precision recomputes pycocotools' accumulation per resample: at most these
REPORTED_RESAMPLES = 199   # ... and these for one that is only reported (no threshold)


def kinds_judge(ev) -> bool:
    """Whether an output's kind brings metrics of its own (so labels of its form are read there)."""
    from tiergate.metrics.kinds import family

    return any(family(kind) for kind in ev.kinds.values())


def kind_metrics(ev, m: TargetMetrics, cand, ref, labels) -> None:
    """Each output kind's metrics: a policy's [metrics.NAME] (or --metric NAME) sets its threshold, else the
    kind's default (metrics.kinds.DEFAULTS, with labels of the kind's form or against FP32's outputs)."""
    from tiergate.metrics import kinds as km

    named = {s.name: s for s in ev.specs if s.kind in km.NAMES}
    used: set[str] = set()
    judged_outputs = [(name, kind) for name, kind in ev.kinds.items() if km.family(kind)]
    families = [km.family(kind) for _, kind in judged_outputs]
    for output, kind in judged_outputs:
        family, cache = km.family(kind), {}
        needed = [output] + ([kind.scores] if family == "ssd" else [])
        if any(name not in m.outputs and not any(k.startswith(f"{name}:") for k in m.outputs) for name in needed):
            continue                   # missing or misshapen in the candidate: already failed
        for name in km.BY_KIND[family]:
            spec = named.get(name)
            if spec is not None and spec.output not in (None, output):
                continue
            judged = km.judge(name, kind, cand.outputs, ref.outputs, labels, cache)
            if judged is None:
                continue
            used.add(name)
            spec = spec or _default_spec(name, output, judged.basis == "labels")
            _kind_check(ev, m, spec, output, judged, families.count(family) > 1)
    for name, spec in named.items():
        if name not in used:
            ev.note(f"metric {name}: no output of the kind it reads ({', '.join(k for k, v in km.BY_KIND.items() if name in v)}"
                    "; tiergate inspect shows each output's kind, [outputs.NAME] sets it); not computed")


def _default_spec(name: str, output: str, with_labels: bool) -> MetricSpec:
    from tiergate.metrics.kinds import DEFAULTS

    table = (DEFAULTS.get(name) or (None, None))[0 if with_labels else 1] or {}
    return MetricSpec(name, name, output, min_ratio=table.get("min_ratio"), max_drop=table.get("max_drop"),
                      implicit=True, explicit_off=not table)


def _kind_check(ev, m: TargetMetrics, spec: MetricSpec, output: str, judged, several: bool) -> None:
    difference = spec.max_drop is not None
    op, threshold = task_threshold(spec, None)
    costly = spec.kind in ("map", "map50")
    resamples = min(ev.t.bootstrap_resamples, KIND_RESAMPLES if threshold is not None else REPORTED_RESAMPLES) \
        if costly else ev.t.bootstrap_resamples
    if judged.same:                   # the same outputs: the same value on every resample
        judged.ref, judged.ref_statistic = judged.cand, judged.statistic
    interval = stats.metric_ratio(judged.cand, judged.ref, judged.statistic,
                                  ref_statistic=None if judged.same else judged.ref_statistic,
                                  confidence=ev.t.confidence, n_resamples=resamples, seed=ev.seed,
                                  difference=difference, percentile=costly)
    cand_value = float(judged.statistic(judged.cand, axis=-1))
    ref_value = float(judged.ref_statistic(judged.ref, axis=-1))
    against = "labels" if judged.basis == "labels" else "FP32's decoded outputs"
    detail = f"candidate {cand_value:.4g} vs FP32 {ref_value:.4g}, against {against}"
    ev.judged(m, spec, f"{spec.name}_{'difference' if difference else 'ratio'}", output, judged.n, cand_value,
              ref_value, interval, op, threshold, detail, key=f"{spec.name}[{output}]" if several else None)
