"""The gate: from saved results on every device class to PROMOTE, REJECT or INCONCLUSIVE, every check listed.

Pure computation over saved results (no Docker, no Prefect). Inputs, per device
class: the candidate's RunOutcome, the FP32 reference's, optionally the
incumbent's (the currently promoted artifact), all run on the same samples.

The caller says whether the candidate is quantized (`quantized=True`, e.g. from
`Artifact.is_quantized`): the cosine and SQNR floors apply to quantized
candidates only. A failed run is a failed check (REJECT), never a crash; the
other device classes are still evaluated.

Task metrics (top-1, `[metrics.NAME]`, `--metric`) compare the candidate with the
FP32 reference on the same tier as a ratio with a paired-bootstrap confidence
interval: a check passes when the whole interval clears its threshold, fails when
it lies wholly on the wrong side, and is otherwise inconclusive, with the samples
that would be needed at the observed effect. With labels, task metrics decide and
output agreement is evidence (warnings) unless the policy says `agreement = "gate"`.
Verdict: REJECT if any check failed; else INCONCLUSIVE (or what `on_inconclusive`
says) if any was inconclusive; else PROMOTE.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tiergate import results as results_mod
from tiergate import stats
from tiergate.decision import (ALL_CLASSES, INCONCLUSIVE, PROMOTE, REJECT, SCHEMA,  # noqa: F401 - re-exported
                               VERDICT_EXIT, ABResult, Check, Decision, DriftMatrix, TargetMetrics, TaskMetric,
                               TierLooks)
from tiergate.errors import InputError
from tiergate.fmt import number
from tiergate.metrics.accuracy import Estimate, accuracy, correct, is_classifier, predictions
from tiergate.metrics.cost import cost_per_1k
from tiergate.metrics.device import FIGURES, ratios as device_ratios
from tiergate.metrics.drift import OutputDrift, compare_outputs, non_finite_count, shared_drift
from tiergate.metrics.latency import LatencyStats, latency_stats
from tiergate.metrics.task import MetricSpec
from tiergate.npu import checks as npu_checks, is_npu
from tiergate.policy import Policy, Thresholds
from tiergate.results import MB, TargetResult
from tiergate.targets import DeviceClass

@dataclass
class RunOutcome:
    """One saved run: its TargetResult and its outputs (None when the run failed)."""

    result: TargetResult
    outputs: dict[str, np.ndarray] | None = None

    @property
    def ok(self) -> bool:
        return self.result.ok and self.outputs is not None

    @classmethod
    def load(cls, folder: str | Path) -> "RunOutcome":
        """Read a result folder (result.json, and outputs.npz when the run succeeded)."""
        folder = Path(folder)
        result = results_mod.load(folder)
        return cls(result, results_mod.load_outputs(folder) if result.ok else None)


def evaluate(candidate: dict[str, RunOutcome], reference: dict[str, RunOutcome],
             device_classes: dict[str, DeviceClass], policy: Policy, labels: np.ndarray | None,
             incumbent: dict[str, RunOutcome] | None = None, *, quantized: bool = False,
             label_output: str | None = None, seed: int = 0, metrics: list[MetricSpec] | None = None,
             carried: frozenset[str] = frozenset()) -> Decision:
    """Every check on every device class the candidate ran on, and the verdict.

    `labels` (one int per sample) enable accuracy; without them the A/B test
    uses agreement with the FP32 reference's top-1 as per-sample correctness.
    `label_output` names the classifier output (default: the first output with
    two or more scores per sample). `seed` makes the bootstrap reproducible.
    `metrics`: the task metrics (tiergate.metrics.task.resolve; default: top-1 only).
    """
    from tiergate.metrics.task import resolve

    incumbent = incumbent or {}
    _check_inputs(candidate, reference, incumbent, device_classes)
    labels = _check_label_array(labels)
    specs = list(metrics) if metrics is not None else resolve([], policy)
    checks, notes, warnings, per_class = [], [], [], {}
    on_inconclusive = set()
    for name in candidate:
        thresholds = policy.for_target(device_classes[name])
        target = _TargetEval(device_classes[name], thresholds, quantized, seed, specs)
        target.carried = carried
        per_class[name] = target.run(candidate[name], reference[name], incumbent.get(name), labels, label_output)
        checks += target.checks
        notes += target.notes
        warnings += target.warnings
        on_inconclusive.add(thresholds.on_inconclusive)
    for name in incumbent:
        if name not in candidate:
            notes.append(f"incumbent result for {name} ignored: the candidate did not run there")
    drift = {"candidate": cross_tier_drift(candidate), "reference": cross_tier_drift(reference)}
    verdict = verdict_of(checks, on_inconclusive)
    if verdict != INCONCLUSIVE and any(c.inconclusive for c in checks) and not any(
            not c.passed and not c.inconclusive for c in checks):
        notes.append(f"inconclusive task metrics decided as {verdict} by the policy's on_inconclusive")
    return Decision(verdict, checks, per_class, drift, notes, quantized, list(policy.sources), warnings)


def verdict_of(checks: list[Check], on_inconclusive: set[str] | str = "inconclusive") -> str:
    """REJECT if any check failed; else, if any was inconclusive, what on_inconclusive says; else PROMOTE."""
    if not checks or any(not c.passed and not c.inconclusive for c in checks):
        return REJECT
    if not any(c.inconclusive for c in checks):
        return PROMOTE
    modes = {on_inconclusive} if isinstance(on_inconclusive, str) else set(on_inconclusive) or {"inconclusive"}
    if "reject" in modes:
        return REJECT
    return INCONCLUSIVE if "inconclusive" in modes else PROMOTE


# A failed check of these on some samples fails on every superset of them (a crash, a NaN, a wrong shape, a
# largest error, the artifact's size): an early look may stop on it. Other checks without an interval are
# estimates on the samples used (a mean cosine, a percentile): an early look never stops on their failure.
SETTLED_WHEN_FAILED = frozenset({"run", "reference_run", "memory_limit", "output_present", "output_shape", "finite",
                                 "reference_finite", "max_abs_error", "artifact_mb", "artifact_ratio",
                                 "artifact_ratio_vs_incumbent"})
_INTERVAL_CHECKS = frozenset({"noninferior_accuracy", "noninferior_latency"})   # judged on an interval's bound


def settled(checks: list[Check]) -> str | None:
    """The verdict an early look may stop a tier on, or None (look further).

    REJECT when a check failed decisively: its interval (at the look's share of alpha) lies wholly on the wrong
    side, or it is one of SETTLED_WHEN_FAILED. PROMOTE when every check passed and at least one is judged on an
    interval (a tier whose checks are all point estimates has no error to control: it never stops early on a
    PROMOTE). Anything else (an inconclusive check, an estimate that failed on the samples so far) looks further.
    """
    if any(not c.passed and not c.inconclusive and (c.interval is not None or c.name in SETTLED_WHEN_FAILED)
           for c in checks):
        return REJECT
    if checks and all(c.passed for c in checks) and any(c.interval is not None or c.name in _INTERVAL_CHECKS
                                                        for c in checks):
        return PROMOTE
    return None


EARLY_METHOD = ("group-sequential looks at growing prefixes of the samples (K disjoint chunks, each run once); "
                "every interval at a taken look is judged at that look's share of alpha = 1 - confidence under "
                "Lan-DeMets alpha spending, so by the union bound all looks together err with at most alpha; a look "
                "whose samples cannot resolve its share (fewer than 1/share samples, or fewer than 10 bootstrap "
                "resamples beyond a bound) is not taken and passes its share on; a tier stops at the first look "
                "whose verdict is settled (an interval wholly on one side, or a failure that more samples cannot "
                "undo); the last look decides whatever it shows")


def combine_tiers(per_tier: dict[str, Decision], looks: dict[str, TierLooks], drift: dict[str, DriftMatrix],
                  policy: Policy, on_inconclusive: set[str], method: str) -> Decision:
    """One decision from each tier's own (an early decision: tiers stop at different looks): their checks,
    metrics, notes and warnings in tier order, the verdict over all checks as `evaluate` gives it."""
    checks, notes, warnings, metrics = [], [], [], {}
    inconclusive_note = "inconclusive task metrics decided as"
    for name, decision in per_tier.items():
        checks += decision.checks
        metrics.update(decision.metrics)
        notes += [n for n in decision.notes if not n.startswith(inconclusive_note)]
        warnings += decision.warnings
    verdict = verdict_of(checks, on_inconclusive)
    if verdict != INCONCLUSIVE and any(c.inconclusive for c in checks) and not any(
            not c.passed and not c.inconclusive for c in checks):
        notes.append(f"{inconclusive_note} {verdict} by the policy's on_inconclusive")
    notes.append(f"early stop: {method}")
    for name, t in looks.items():
        if t.stopped_by:
            when = f"after look {t.look} of {t.looks}" if t.look else "before its first look"
            notes.append(f"{name}: early stop: stopped {when}, not settled: {t.stopped_by}'s REJECT is final, so the "
                         f"gate's verdict is REJECT whatever {name} shows")
        elif t.stopped_early:
            notes.append(f"{name}: early stop: {t.verdict} settled at look {t.look} of {t.looks}, on {t.samples_used} "
                         f"of {t.samples_total} samples (intervals at {t.confidence:.4%})")
        else:
            notes.append(f"{name}: early stop: no earlier look settled it; decided at look {t.look} of {t.looks} on "
                         f"{t.samples_used} samples (intervals at {t.confidence:.4%})")
    quantized = next(iter(per_tier.values())).quantized if per_tier else False
    return Decision(verdict, checks, metrics, drift, notes, quantized, list(policy.sources), warnings, dict(looks))


def signature_decision(differences: list[tuple[str, str]], device_classes, policy: Policy, *,
                       quantized: bool = False) -> Decision:
    """REJECT before anything runs: each signature difference of the candidate (or incumbent) is a failed check."""
    checks = [Check(ALL_CLASSES, "", "signature", role, "reference", "==", False, detail=text)
              for role, text in differences]
    notes = [f"nothing was built or run: the {role}'s signature differs from the FP32 reference's"
             for role in dict.fromkeys(role for role, _ in differences)]
    return Decision(REJECT, checks, {}, {}, notes, quantized, list(policy.sources))


def cross_tier_drift(outcomes: dict[str, RunOutcome]) -> DriftMatrix:
    """Pairwise drift between the successful runs of one artifact on several device classes."""
    names = [name for name, outcome in outcomes.items() if outcome.ok]
    pairs = {}
    for row in names:
        for col in names:
            if row != col:
                pairs[(row, col)] = shared_drift(outcomes[row].outputs, outcomes[col].outputs)
    return DriftMatrix(names, pairs)


class _TargetEval:
    """The checks and metrics of one device class."""

    def __init__(self, dc: DeviceClass, thresholds: Thresholds, quantized: bool, seed: int,
                 specs: list[MetricSpec] | None = None):
        self.dc, self.t, self.quantized, self.seed = dc, thresholds, quantized, seed
        self.specs = list(specs or [])
        self.checks: list[Check] = []
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.agreement_gates = thresholds.agreement != "evidence"

    def check(self, name, value, op, threshold, *, output=None, detail="", passed=None, interval=None,
              inconclusive=False, samples_needed=None) -> bool:
        if passed is None:
            passed = _compare(value, op, threshold)
        self.checks.append(Check(self.dc.name, self.dc.tier, name, _plain(value), _plain(threshold), op,
                                 bool(passed), output, detail, interval, inconclusive, samples_needed))
        return bool(passed)

    def note(self, text: str) -> None:
        self.notes.append(f"{self.dc.name}: {text}")

    @property
    def emulated(self) -> bool:
        return self.dc.emulated

    def run(self, cand: RunOutcome, ref: RunOutcome, inc: RunOutcome | None, labels, label_output):
        m = TargetMetrics(self.dc.name, self.dc.tier, self.dc.execution, self.emulated or cand.result.emulated,
                          cand.result.status, ref.result.status, self.t)
        cand_ok = self.check("run", cand.result.status, "==", "ok", passed=cand.ok,
                             detail=_failure(cand, "candidate"))
        ref_ok = self.check("reference_run", ref.result.status, "==", "ok", passed=ref.ok,
                            detail=_failure(ref, "FP32 reference"))
        self._latency(m, cand, ref, inc)
        self._device_figures(m, cand, ref, inc)
        if is_npu(self.dc):               # Vela's placement, estimate and memory (tiergate.npu.checks)
            npu_checks.evaluate(self, m, cand, ref, inc)
        if not (cand_ok and ref_ok):
            return m
        m.label_output = _pick_label_output(ref.outputs, label_output, labels, self.specs,
                                            getattr(self, "carried", frozenset()))
        drifts = self._outputs(m, cand.outputs, ref.outputs)
        if _class_labels(labels) and m.label_output is not None:
            self._accuracy(m, cand, ref, inc, labels)
        elif labels is not None and all(s.kind == "top1" for s in self.specs):
            self.note("labels are not one class index per sample and no task metric is named "
                      "([metrics.NAME] or --metric): no task metric computed")
        self._task_metrics(m, cand, ref, labels)
        decided = any(c.interval is not None for c in self.checks)
        self.agreement_gates = self.t.agreement == "gate" or (self.t.agreement == "auto" and not decided)
        for name, drift in drifts.items():
            self._drift_checks(name, drift)
        if inc is not None:
            self._ab(m, cand, ref, inc, labels)
        return m

    # -- agreement with the FP32 reference, per output -------------------------------------
    def _outputs(self, m: TargetMetrics, cand: dict, ref: dict) -> dict[str, OutputDrift]:
        for name, ref_out in ref.items():
            out = cand.get(name)
            if out is None:
                self.check("output_present", "missing", "==", "present", output=name, passed=False,
                           detail=f"candidate outputs: {', '.join(cand) or 'none'}")
                continue
            if out.shape != ref_out.shape:
                self.check("output_shape", str(out.shape), "==", str(ref_out.shape), output=name, passed=False)
                continue
            m.outputs[name] = drift = compare_outputs(ref_out, out)
            self.check("finite", drift.non_finite, "==", 0, output=name,
                       detail="NaN or Inf in the candidate's output" if drift.non_finite else "")
            ref_bad = non_finite_count(ref_out)
            self.check("reference_finite", ref_bad, "==", 0, output=name,
                       detail="NaN or Inf in the FP32 reference's output" if ref_bad else "")
        for name in cand:
            if name not in ref:
                self.note(f"candidate output '{name}' has no FP32 reference counterpart; not compared")
        return dict(m.outputs)

    def _drift_checks(self, name: str, drift: OutputDrift) -> None:
        t = self.t
        limits = [("top1_agreement", ">=", t.min_top1_agreement), ("relative_l2", "<=", t.max_relative_l2),
                  ("max_abs_error", "<=", t.max_abs_error), ("kl_divergence", "<=", t.max_kl_divergence)]
        if self.quantized:
            limits = [("cosine", ">=", t.min_cosine), ("sqnr_db", ">=", t.min_sqnr_db)] + limits
        for metric, op, threshold in limits:
            if threshold is None:
                continue
            value = getattr(drift, metric)
            if value is None:
                self.note(f"{metric} limit not applied to output '{name}' (not a "
                          f"{'probability' if metric == 'kl_divergence' else 'classifier'} output)")
                continue
            if self.agreement_gates:
                self.check(metric, value, op, threshold, output=name)
            elif not _compare(value, op, threshold):
                self.warnings.append(f"{self.dc.name}: {metric}[{name}] is {_fmt(value)}, the limit is {op} "
                                     f"{_fmt(threshold)} (evidence only: task metrics decide; policy "
                                     "agreement = \"gate\" makes it a check)")

    # -- accuracy against labels -----------------------------------------------------------
    def _accuracy(self, m: TargetMetrics, cand, ref, inc, labels) -> None:
        name, conf = m.label_output, self.t.confidence
        _check_labels_fit(labels, ref.outputs[name], name)
        if name not in m.outputs:          # missing or misshapen in the candidate: already failed
            return
        m.accuracy["candidate"] = acc = accuracy(cand.outputs[name], labels, conf)
        m.accuracy["reference"] = base = accuracy(ref.outputs[name], labels, conf)
        if inc is not None and inc.ok and _same_shape(inc, name, ref):
            m.accuracy["incumbent"] = accuracy(inc.outputs[name], labels, conf)
        top1 = next((s for s in self.specs if s.kind == "top1"), None)
        if top1 is None:
            return
        threshold = top1.min_ratio if top1.min_ratio is not None else self.t.min_accuracy_ratio
        hits_c, hits_r = correct(cand.outputs[name], labels), correct(ref.outputs[name], labels)
        counts = stats.pair_counts(hits_c, hits_r)
        interval = stats.paired_interval(counts, "ratio", conf)
        mcnemar = stats.mcnemar_exact(hits_c, hits_r)
        detail = (f"candidate {_pct(acc)} vs FP32 {_pct(base)}; {mcnemar.only_a} samples only the candidate "
                  f"gets right, {mcnemar.only_b} only FP32, McNemar exact p = {mcnemar.p_value:.3g}")
        self._judged(m, top1, "accuracy_ratio", name, len(labels), acc.value, base.value, interval, ">=",
                     threshold, detail, counts=counts)

    # -- task metrics: candidate / FP32 reference, judged on the interval -------------------
    def _task_metrics(self, m: TargetMetrics, cand, ref, labels) -> None:
        from tiergate.metrics import task

        for spec in self.specs:
            if spec.kind == "top1":
                continue
            if labels is None and spec.kind != "custom":
                self.note(f"metric {spec.name} needs labels; not computed")
                continue
            if spec.kind == "custom":
                self._custom_metric(m, spec, cand.outputs, ref.outputs, labels)
                continue
            name = task.pick_output(spec, ref.outputs, labels, m.label_output)
            if name is None or name not in m.outputs:
                self.note(f"metric {spec.name}: no comparable output; not computed")
                continue
            a, b = task.prepare(spec, cand.outputs[name], labels), task.prepare(spec, ref.outputs[name], labels)
            counts = stats.pair_counts(a.components[0], b.components[0]) if spec.kind == "topk" else None
            difference = spec.max_drop is not None
            interval = stats.paired_interval(counts, "ratio", self.t.confidence) if counts else \
                stats.metric_ratio(a.components, b.components, a.statistic, confidence=self.t.confidence,
                                   n_resamples=self.t.bootstrap_resamples, seed=self.seed, difference=difference)
            op, threshold = _task_threshold(spec, self.t.min_accuracy_ratio)
            self._judged(m, spec, f"{spec.name}_{'difference' if difference else 'ratio'}", name, len(labels),
                         task.value(a), task.value(b), interval, op, threshold,
                         f"candidate {task.value(a):.4g} vs FP32 {task.value(b):.4g}", counts=counts)

    def _custom_metric(self, m: TargetMetrics, spec: MetricSpec, cand: dict, ref: dict, labels) -> None:
        from tiergate.metrics.task import custom_value, refuse_ratio_of_nonpositive

        n = len(next(iter(ref.values())))
        if any(len(v) != n for v in (*cand.values(), *ref.values())):
            self.note(f"metric {spec.name}: outputs differ in sample count; not computed")
            return

        difference = spec.max_drop is not None

        def pair(idx):
            lab = None if labels is None else labels[idx]
            values = (custom_value(spec, {k: v[idx] for k, v in cand.items()}, lab),
                      custom_value(spec, {k: v[idx] for k, v in ref.items()}, lab))
            if not difference:       # a user metric's range is unknown: a ratio only of positive values
                refuse_ratio_of_nonpositive(spec, dict(zip(("candidate", "reference"), values)))
            return values
        a, b = pair(np.arange(n))
        interval = stats.metric_ratio(n, None, pair, confidence=self.t.confidence,
                                      n_resamples=self.t.bootstrap_resamples, seed=self.seed, vectorised=False,
                                      difference=difference)
        op, threshold = _task_threshold(spec, self.t.min_accuracy_ratio)
        self._judged(m, spec, f"{spec.name}_{'difference' if difference else 'ratio'}", None, n, a, b, interval,
                     op, threshold, f"candidate {a:.4g} vs FP32 {b:.4g} ({spec.source})")

    def _judged(self, m: TargetMetrics, spec: MetricSpec, check: str, output, n: int, cand_value: float,
                ref_value: float, interval: stats.Interval, op: str, threshold, detail: str,
                counts: stats.PairCounts | None = None) -> None:
        """A task metric's figures, and its check where it has a threshold (_interval_check)."""
        outcome, needed = "reported", None
        if threshold is not None:
            outcome, needed = self._interval_check(check, interval, op, threshold, n, detail, output=output,
                                                   counts=counts)
        m.task[spec.name] = TaskMetric(spec.name, output, n, float(cand_value), float(ref_value), interval, op,
                                       threshold, outcome, needed, spec.source)

    def _interval_check(self, name: str, interval: stats.Interval, op: str, threshold: float, n: int, detail: str,
                        *, output=None, counts: stats.PairCounts | None = None, needed_note: str = ""):
        """A check decided on an interval: pass when all of it clears the threshold, fail when none of it does, else
        inconclusive with the samples (of n) that would decide it at the observed effect. `counts`: a paired
        proportion's pairs (its samples needed come from its own interval, scaled); `needed_note`: added to the
        detail when inconclusive, formatted with `needed`. (outcome, needed)"""
        outcome, needed = stats.judge(interval, op, threshold), None
        if outcome == stats.INCONCLUSIVE:
            needed = stats.samples_needed(interval, threshold, n) if counts is None else \
                stats.paired_samples_needed(counts, "ratio", op, threshold, interval.confidence)
        self.check(name, interval.estimate, op, threshold, output=output,
                   detail=detail + (needed_note.format(needed=needed) if needed else ""),
                   passed=outcome == stats.PASS, interval=interval, inconclusive=outcome == stats.INCONCLUSIVE,
                   samples_needed=needed)
        return outcome, needed

    # -- latency and cost ------------------------------------------------------------------
    def _latency(self, m: TargetMetrics, cand, ref, inc) -> None:
        if is_npu(self.dc):              # the reference kernels' time on this host is not the NPU's
            self.note(npu_checks.NOT_TIMED)
            return
        for side, outcome in (("candidate", cand), ("reference", ref), ("incumbent", inc)):
            if outcome is not None and outcome.result.ok:
                stats_ = latency_stats(outcome.result.latencies_ns, outcome.result.batch_size or 1,
                                       emulated=m.emulated, max_cov=self.t.max_latency_cov,
                                       min_samples_p99=self.t.p99_min_samples)
                if stats_ is not None:
                    m.latency[side] = stats_
        lat, base = m.latency.get("candidate"), m.latency.get("reference")
        if lat and base:
            m.latency_ratio_vs_reference = lat.mean_ms / base.mean_ms if base.mean_ms > 0 else math.nan
        if not m.emulated and cand.result.ok:
            self._interleaved(m, cand, ref)
        if lat and lat.unstable:
            self.note(f"candidate latency is unstable (CoV {lat.cov:.2f} > {self.t.max_latency_cov}); "
                      "reported, not trusted" + ("; its ratio to the reference is from interleaved call pairs"
                                                 if m.latency_ratio_interval is not None else ""))
        if m.emulated:
            if lat:
                ev = cand.result.extra.get("evaluation") or {}
                how = (f"; timed on {ev['latency_calls']} calls, outputs in calls of {ev['eval_batch']} samples "
                       f"(checked equal to single calls)" if ev.get("batched") else "")
                self.note("latency is emulated (QEMU): reported, used only relative to the FP32 reference, "
                          f"not gated; no cost computed{how}")
            return
        if cand.ok:
            self._latency_checks(m, lat)
        self._cost(m, cand.ok)

    def _interleaved(self, m: TargetMetrics, cand, ref) -> None:
        """candidate / reference latency from the candidate's calls interleaved with the reference's in one process
        (extra.paired, harness_paired.py): the median per-pair ratio and its interval; a noisy host slows both
        calls of a pair, so this ratio holds where two loops' means do not."""
        interval, n = self._pairs_with(cand, ref, "reference")
        if interval is not None:
            m.latency_ratio_vs_reference, m.latency_ratio_interval, m.latency_pairs = interval.estimate, interval, n

    def _pairs_with(self, cand, other, who: str):
        """(interval of candidate / `other` from their interleaved calls, pairs), or (None, 0) with a note saying
        why the ratio falls back to the runs' means."""
        paired = cand.result.extra.get("paired")
        if not isinstance(paired, dict):
            return None, 0
        if paired.get("error"):
            text = f"interleaved latency failed ({paired['error']}); latency ratios are of the runs' means"
            if f"{self.dc.name}: {text}" not in self.notes:
                self.note(text)
            return None, 0
        sha = other.result.artifact_sha256
        if sha and sha == cand.result.artifact_sha256:      # the same file: never paired, its ratio is 1
            return None, 0
        mine = paired.get("latencies_ns") or []
        theirs = next((p.get("latencies_ns") or [] for p in paired.get("partners") or []
                       if isinstance(p, dict) and sha and p.get("sha256") == sha), None)
        if theirs is None or not mine or len(mine) != len(theirs):
            self.note(f"the candidate's interleaved calls are not with this {who}; the latency ratio to it is of "
                      "the runs' means")
            return None, 0
        return stats.interleaved_latency_ratio(mine, theirs, confidence=self.t.confidence), len(mine)

    def _cost(self, m: TargetMetrics, candidate_ok: bool) -> None:
        """Cost per 1,000 inferences on real hardware only (never from emulated latency)."""
        for side in ("candidate", "reference"):
            if side in m.latency:
                m.cost_per_1k[side] = cost_per_1k(self.dc.cost_per_hour, m.latency[side].throughput_per_s)
        if self.t.max_cost_per_1k is not None and candidate_ok:
            self.check("cost_per_1k", m.cost_per_1k.get("candidate"), "<=", self.t.max_cost_per_1k,
                       detail=f"{self.dc.cost_per_hour}/h at measured single-stream throughput")

    def _latency_checks(self, m: TargetMetrics, lat: LatencyStats | None) -> None:
        limits = [("latency_p50_ms", self.t.max_latency_p50_ms), ("latency_p90_ms", self.t.max_latency_p90_ms),
                  ("latency_p99_ms", self.t.max_latency_p99_ms), ("latency_ratio", self.t.max_latency_ratio)]
        for name, limit in limits:
            if limit is None:
                continue
            if name == "latency_ratio" and m.latency_ratio_interval is not None:
                self._interleaved_check(m, limit)
                continue
            value = m.latency_ratio_vs_reference if name == "latency_ratio" else \
                (getattr(lat, name.removeprefix("latency_")) if lat else None)
            untrusted = _untrusted(lat, name, self.t)
            self.check(name, value, "<=", limit, passed=_compare(value, "<=", limit) and not untrusted,
                       detail=untrusted or ("no latency measurements" if lat is None else ""))

    def _interleaved_check(self, m: TargetMetrics, limit: float) -> None:
        """max_latency_ratio on the interleaved pairs' interval, as a task metric is: pass when all of it is at
        or under the limit, fail when all of it is over, else inconclusive with the pairs needed."""
        interval, n = m.latency_ratio_interval, m.latency_pairs
        self._interval_check("latency_ratio", interval, "<=", limit, n,
                             f"candidate / FP32 reference per interleaved call pair, median of {n} pairs, "
                             f"{interval.confidence:.0%} CI [{interval.low:.3f}, {interval.high:.3f}]",
                             needed_note="; about {needed} pairs would decide it ([evaluation] latency_pairs)")

    # -- device figures: memory, load, first call, size (metrics/device.py) ----------------
    def _device_figures(self, m: TargetMetrics, cand, ref, inc) -> None:
        """Figures per side, ratios, and their limits; time and memory are not gated on emulated classes."""
        for outcome, who in ((cand, "candidate"), (ref, "FP32 reference")):
            limit = outcome.result.oom_limit_bytes
            if limit:
                self.check("memory_limit", f"out of memory ({who})", "<", limit / MB, passed=False,
                           detail=f"the {who}'s run was killed at {self.dc.name}'s memory limit of "
                                  f"{limit / MB:.0f} MB (memory_limit_mb); it needs more on tier {self.dc.tier}")
        if is_npu(self.dc):              # the host's memory and times, not the device's (npu_checks.NOT_TIMED)
            return
        for side, outcome in (("candidate", cand), ("reference", ref), ("incumbent", inc)):
            if outcome is not None and outcome.result.ok and outcome.result.device is not None:
                m.device[side] = dataclasses.replace(outcome.result.device, emulated=m.emulated)
        figures = m.device.get("candidate")
        m.device_ratios = {**device_ratios(figures, m.device.get("reference")),
                           **device_ratios(figures, m.device.get("incumbent"), "_vs_incumbent")}
        if not cand.ok:
            return
        if figures is None:
            self.note("no device figures in the candidate's run (an older harness?): a device limit fails")
        skipped, uncounted = [], []
        for fig in FIGURES:
            limits = [(fig.name, fig.value(figures), getattr(self.t, fig.limit_key), fig.limit_key),
                      (f"{fig.base}_ratio", m.device_ratios.get(f"{fig.base}_ratio"),
                       getattr(self.t, fig.ratio_key), fig.ratio_key),
                      (f"{fig.base}_ratio_vs_incumbent", m.device_ratios.get(f"{fig.base}_ratio_vs_incumbent"),
                       getattr(self.t, fig.incumbent_ratio_key), fig.incumbent_ratio_key)]
            for name, value, limit, key in limits:
                if limit is None or (name.endswith("_vs_incumbent") and inc is None):
                    continue
                if m.emulated and fig.emulation_bound:
                    skipped.append(key)
                    continue
                if fig.counted and not m.emulated:
                    uncounted.append(key)
                    continue
                versus = "incumbent" if name.endswith("_vs_incumbent") else "FP32 reference"
                what = fig.meaning if name == fig.name else f"candidate / {versus}, {fig.meaning}"
                self.check(name, value, "<=", limit, detail=f"{key} on tier {self.dc.tier}: {what}"
                           + ("" if value is not None else " (not measured)"))
        if uncounted:
            self.note(f"instructions are counted on emulated classes only (under the counting QEMU): not gated "
                      f"natively ({', '.join(uncounted)})")
        if skipped:
            self.note(f"device figures are emulated (QEMU user mode: memory includes the emulator): reported, "
                      f"not gated ({', '.join(skipped)})")

    # -- A/B against the incumbent ---------------------------------------------------------
    def _ab(self, m: TargetMetrics, cand, ref, inc, labels) -> None:
        name = m.label_output
        if not inc.ok:
            self.note(f"incumbent run failed ({inc.result.reason}); no A/B comparison")
            return
        if name is None or name not in m.outputs or not _same_shape(inc, name, ref):
            self.note("no classifier output shared with the incumbent; no A/B comparison")
            return
        truth = labels if _class_labels(labels) else predictions(ref.outputs[name])
        basis = "labels" if _class_labels(labels) else "agreement with FP32 top-1"
        ok_cand, ok_inc = correct(cand.outputs[name], truth), correct(inc.outputs[name], truth)
        conf, n_res = self.t.confidence, self.t.bootstrap_resamples
        diff = stats.accuracy_difference(ok_cand, ok_inc, confidence=conf, n_resamples=n_res, seed=self.seed)
        mcnemar = stats.mcnemar_exact(ok_cand, ok_inc)
        m.ab = ABResult(basis, name, mcnemar, diff)
        margin = self.t.noninferiority_margin
        self.check("noninferior_accuracy", diff.low, ">", -margin, output=name,
                   detail=f"candidate - incumbent ({basis}) = {diff.estimate:+.4f}, "
                          f"{conf:.0%} CI [{diff.low:+.4f}, {diff.high:+.4f}]; McNemar exact p = {mcnemar.p_value:.3g}")
        self._ab_latency(m, cand, inc)

    def _ab_latency(self, m: TargetMetrics, cand, inc) -> None:
        """candidate / incumbent latency: from their interleaved calls on a native class (the median per-pair ratio),
        else the bootstrap of the two runs' mean latencies; non-inferior when its upper bound is within the margin."""
        if is_npu(self.dc):
            return
        a, b = cand.result.latencies_ns, inc.result.latencies_ns
        ratio, pairs = (None, 0) if m.emulated else self._pairs_with(cand, inc, "incumbent")
        if ratio is None:
            if len(a) < 2 or len(b) < 2:
                return
            ratio = stats.latency_ratio(a, b, confidence=self.t.confidence, n_resamples=self.t.bootstrap_resamples,
                                        seed=self.seed)
        m.ab = dataclasses.replace(m.ab, latency_ratio=ratio)
        if m.emulated:
            return
        what = f"median of {pairs} interleaved call pairs" if pairs else "mean latency"
        self.check("noninferior_latency", ratio.high, "<=", 1 + self.t.max_latency_regression,
                   detail=f"candidate / incumbent {what} = {ratio.estimate:.3f}, "
                          f"{ratio.confidence:.0%} CI [{ratio.low:.3f}, {ratio.high:.3f}]")


# -- input validation ----------------------------------------------------------------------
def _check_inputs(candidate, reference, incumbent, device_classes) -> None:
    if not candidate:
        raise InputError("gate: no candidate results to evaluate")
    for side, outcomes in (("candidate", candidate), ("reference", reference), ("incumbent", incumbent)):
        for name, outcome in outcomes.items():
            if name not in device_classes:
                raise InputError(f"{side} result: unknown device class '{name}'; known: "
                                 f"{', '.join(sorted(device_classes))}")
            if outcome.result.device_class and outcome.result.device_class != name:
                raise InputError(f"{side} result filed under '{name}' was run on "
                                 f"'{outcome.result.device_class}'")
    missing = [name for name in candidate if name not in reference]
    if missing:
        raise InputError(f"no FP32 reference result for device class {', '.join(map(repr, missing))}")


def _check_label_array(labels) -> np.ndarray | None:
    if labels is None:
        return None
    labels = np.asarray(labels)
    if labels.ndim == 0 or not (np.issubdtype(labels.dtype, np.number) or labels.dtype == np.bool_):
        raise InputError(f"labels must be numbers with the sample axis first, got shape {labels.shape} "
                         f"dtype {labels.dtype}")
    if np.issubdtype(labels.dtype, np.integer) and labels.size and labels.min() < 0:
        raise InputError(f"labels must not be negative (found {labels.min()})")
    return labels


def _pick_label_output(outputs: dict[str, np.ndarray], wanted: str | None, labels, specs=(),
                       carried=frozenset()) -> str | None:
    """The output labels are scored against: named, else the first with two or more scores per sample that
    is not a carried state (an output shaped as one of the model's inputs, fed back: silero's stateN)."""
    if wanted is not None:
        if wanted not in outputs:
            raise InputError(f"label output '{wanted}' is not a model output (outputs: {', '.join(outputs)})")
        return wanted
    name = next((name for name, out in outputs.items() if name not in carried and is_classifier(out)), None)
    only_top1 = all(s.kind == "top1" for s in specs)
    if name is None and _class_labels(labels) and only_top1:
        raise InputError("labels given, but no model output has two or more scores per sample "
                         "(for other tasks name a metric: [metrics.NAME] in the policy or --metric)")
    return name


def _class_labels(labels) -> bool:
    return labels is not None and labels.ndim == 1 and np.issubdtype(labels.dtype, np.integer)


def _check_labels_fit(labels: np.ndarray, output: np.ndarray, name: str) -> None:
    if len(labels) != len(output):
        raise InputError(f"labels: {len(labels)} labels but output '{name}' holds {len(output)} samples")
    classes = output.size // max(len(output), 1)
    if labels.size and labels.max() >= classes:
        raise InputError(f"labels: label {labels.max()} but output '{name}' has only {classes} scores per sample")


# -- small helpers -------------------------------------------------------------------------
def _untrusted(lat: LatencyStats | None, name: str, t: Thresholds) -> str:
    if lat is None:
        return ""
    if lat.unstable:
        return f"unstable run: CoV {lat.cov:.2f} > {t.max_latency_cov}; rerun on a quieter machine"
    if name == "latency_p99_ms" and not lat.p99_reliable:
        return f"only {lat.n_calls} calls; p99 needs at least {t.p99_min_samples}"
    return ""


def _same_shape(outcome: RunOutcome, name: str, ref: RunOutcome) -> bool:
    out = (outcome.outputs or {}).get(name)
    return out is not None and out.shape == ref.outputs[name].shape


def _failure(outcome: RunOutcome, who: str) -> str:
    if outcome.ok:
        return ""
    if outcome.result.ok:
        return f"{who} run has no saved outputs"
    return f"{who} run failed: {outcome.result.reason or 'no reason recorded'}"


def _task_threshold(spec: MetricSpec, default_ratio: float | None) -> tuple[str, float | None]:
    """(op, threshold) of a task metric's check: a difference candidate - reference with `max_drop` (at least
    -max_drop; an error metric's at most +max_drop), else a ratio candidate / reference (min_ratio, an error
    metric's or a user metric's max_ratio; min_accuracy_ratio by default)."""
    if spec.max_drop is not None:
        drop = float(spec.max_drop)
        return ("<=", drop) if not spec.higher_is_better else (">=", -drop if drop else 0.0)
    if spec.kind == "custom":
        op, threshold = (">=", spec.min_ratio) if spec.max_ratio is None else ("<=", spec.max_ratio)
    else:
        op = ">=" if spec.higher_is_better else "<="
        threshold = spec.min_ratio if spec.higher_is_better else spec.max_ratio
    return op, (default_ratio if threshold is None and op == ">=" else threshold)


def _compare(value, op: str, threshold) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return {">=": value >= threshold, "<=": value <= threshold, ">": value > threshold,
            "==": value == threshold}[op]


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _pct(est: Estimate) -> str:
    return f"{est.value:.2%} [{est.low:.2%}, {est.high:.2%}]"


def _fmt(value) -> str:
    return number(value, 6, missing="None")
