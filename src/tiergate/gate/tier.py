"""One device class's checks and metrics: `TierEval.run` calls each part of the gate in turn (timing, device
figures, agreement with the FP32 reference, task metrics, A/B against the incumbent)."""

from __future__ import annotations

from tiergate import stats
from tiergate.decision import Check, TargetMetrics, TaskMetric
from tiergate.gate import ab, agreement, device, tasks, timing
from tiergate.gate.common import class_labels, compare, failure, pick_label_output, plain
from tiergate.metrics.task import MetricSpec
from tiergate.npu import checks as npu_checks, is_npu
from tiergate.policy import Thresholds
from tiergate.targets import DeviceClass


class TierEval:
    """The checks and metrics of one device class."""

    def __init__(self, dc: DeviceClass, thresholds: Thresholds, quantized: bool, seed: int,
                 specs: list[MetricSpec] | None = None, carried: frozenset[str] = frozenset(), kinds=None):
        self.dc, self.t, self.quantized, self.seed = dc, thresholds, quantized, seed
        self.specs = list(specs or [])
        self.carried = carried
        self.kinds = dict(kinds or {})            # output -> tiergate.outputs.OutputKind
        self.task_checks: list[str] = []          # checks made by task metrics (they decide with labels)
        self.checks: list[Check] = []
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.agreement_gates = thresholds.agreement != "evidence"

    def check(self, name, value, op, threshold, *, output=None, detail="", passed=None, interval=None,
              inconclusive=False, samples_needed=None) -> bool:
        if passed is None:
            passed = compare(value, op, threshold)
        self.checks.append(Check(self.dc.name, self.dc.tier, name, plain(value), plain(threshold), op,
                                 bool(passed), output, detail, interval, inconclusive, samples_needed))
        return bool(passed)

    def note(self, text: str) -> None:
        self.notes.append(f"{self.dc.name}: {text}")

    @property
    def emulated(self) -> bool:
        return self.dc.emulated

    def run(self, cand, ref, inc, labels, label_output) -> TargetMetrics:
        m = TargetMetrics(self.dc.name, self.dc.tier, self.dc.execution, self.emulated or cand.result.emulated,
                          cand.result.status, ref.result.status, self.t)
        cand_ok = self.check("run", cand.result.status, "==", "ok", passed=cand.ok,
                             detail=failure(cand, "candidate"))
        ref_ok = self.check("reference_run", ref.result.status, "==", "ok", passed=ref.ok,
                            detail=failure(ref, "FP32 reference"))
        timing.latency(self, m, cand, ref, inc)
        device.figures(self, m, cand, ref, inc)
        if is_npu(self.dc):               # Vela's placement, estimate and memory (tiergate.npu.checks)
            npu_checks.evaluate(self, m, cand, ref, inc)
        if not (cand_ok and ref_ok):
            return m
        m.kinds = {name: kind.summary() for name, kind in self.kinds.items()}
        m.label_output = pick_label_output(ref.outputs, label_output, labels, self.specs, self.carried, self.kinds)
        drifts = agreement.outputs(self, m, cand.outputs, ref.outputs)
        if class_labels(labels) and m.label_output is not None:
            tasks.accuracy(self, m, cand, ref, inc, labels)
        elif labels is not None and all(s.kind == "top1" for s in self.specs) and not tasks.kinds_judge(self):
            self.note("labels are not one class index per sample and no task metric is named "
                      "([metrics.NAME] or --metric): no task metric computed")
        tasks.task_metrics(self, m, cand, ref, labels)
        tasks.kind_metrics(self, m, cand, ref, labels)
        decided = bool(self.task_checks)
        self.agreement_gates = self.t.agreement == "gate" or (self.t.agreement == "auto" and not decided)
        for name, drift in drifts.items():
            agreement.drift_checks(self, name, drift)
        if inc is not None:
            ab.compare(self, m, cand, ref, inc, labels)
        self.decided_by_something()
        return m

    def decided_by_something(self) -> None:
        """Never a PROMOTE decided by nothing: a tier none of whose checks judges its outputs (no task metric, no
        agreement limit, no A/B) and none failed is INCONCLUSIVE, saying why."""
        if any(not c.passed and not c.inconclusive for c in self.checks):
            return
        deciding = set(self.task_checks) | set(agreement.AGREEMENT_CHECKS) | {"noninferior_accuracy"}
        if any(c.name in deciding for c in self.checks):
            return
        self.check("decided_by", "nothing", "==", "a check of the outputs", passed=False, inconclusive=True,
                   detail="no check judged this tier's outputs: no task metric, and every agreement limit is off or "
                          "does not apply (agreement = \"evidence\", or limits set to false); give labels, a metric "
                          "or an agreement limit (docs/policy.md)")

    def judged(self, m: TargetMetrics, spec: MetricSpec, check: str, output, n: int, cand_value: float,
               ref_value: float, interval: stats.Interval, op: str, threshold, detail: str,
               counts: stats.PairCounts | None = None, key: str | None = None) -> None:
        """A task metric's figures, and its check where it has a threshold (interval_check)."""
        outcome, needed = "reported", None
        if threshold is not None:
            outcome, needed = self.interval_check(check, interval, op, threshold, n, detail, output=output,
                                                  counts=counts)
            self.task_checks.append(check)
        m.task[key or spec.name] = TaskMetric(spec.name, output, n, float(cand_value), float(ref_value), interval, op,
                                       threshold, outcome, needed, spec.source)

    def interval_check(self, name: str, interval: stats.Interval, op: str, threshold: float, n: int, detail: str,
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
