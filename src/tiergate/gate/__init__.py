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

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tiergate import results as results_mod
from tiergate.decision import (ALL_CLASSES, INCONCLUSIVE, PROMOTE, REJECT, SCHEMA,  # noqa: F401 - re-exported
                               VERDICT_EXIT, ABResult, Check, Decision, DriftMatrix, TargetMetrics, TaskMetric,
                               TierLooks)
from tiergate.errors import InputError
from tiergate.gate.common import check_label_array
from tiergate.metrics.drift import shared_drift
from tiergate.metrics.task import MetricSpec
from tiergate.policy import Policy
from tiergate.results import TargetResult
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
             carried: frozenset[str] = frozenset(), kinds: dict | None = None) -> Decision:
    """Every check on every device class the candidate ran on, and the verdict.

    `labels` (one int per sample) enable accuracy; without them the A/B test
    uses agreement with the FP32 reference's top-1 as per-sample correctness.
    `label_output` names the classifier output (default: the first output with
    two or more scores per sample). `seed` makes the bootstrap reproducible.
    `metrics`: the task metrics (tiergate.metrics.task.resolve; default: top-1 only).
    `kinds`: each output's kind (tiergate.outputs.resolve on the reference): an output with parts is judged part
    by part, and a kind's own metrics are computed against labels of its form or against FP32's decoded outputs.
    """
    from tiergate.gate.tier import TierEval
    from tiergate.metrics.task import resolve

    incumbent = incumbent or {}
    _check_inputs(candidate, reference, incumbent, device_classes)
    labels = check_label_array(labels)
    specs = list(metrics) if metrics is not None else resolve([], policy)
    checks, notes, warnings, per_class = [], [], [], {}
    on_inconclusive = set()
    # the tiers' drift matrices (read-only work on the loaded outputs, numpy's loops without the GIL) beside the
    # tiers' checks: on a real-size model's maps they are seconds of one core at the gate's end
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiergate-drift") as pool:
        drift_job = pool.submit(lambda: {"candidate": cross_tier_drift(candidate),
                                         "reference": cross_tier_drift(reference)})
        for name in candidate:
            thresholds = policy.for_target(device_classes[name])
            target = TierEval(device_classes[name], thresholds, quantized, seed, specs, carried, kinds)
            per_class[name] = target.run(candidate[name], reference[name], incumbent.get(name), labels,
                                         label_output)
            checks += target.checks
            notes += target.notes
            warnings += target.warnings
            on_inconclusive.add(thresholds.on_inconclusive)
        drift = drift_job.result()
    for name in incumbent:
        if name not in candidate:
            notes.append(f"incumbent result for {name} ignored: the candidate did not run there")
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
        checks += _coverage(decision.checks, looks.get(name))
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
                         f"of {t.samples_total} samples (intervals at {t.confidence:.4%})"
                         + (f"; its point checks ({_covered_names(per_tier[name])}) covered those samples only"
                            if t.verdict == PROMOTE and name in per_tier else ""))
        else:
            notes.append(f"{name}: early stop: no earlier look settled it; decided at look {t.look} of {t.looks} on "
                         f"{t.samples_used} samples (intervals at {t.confidence:.4%})")
    quantized = next(iter(per_tier.values())).quantized if per_tier else False
    return Decision(verdict, checks, metrics, drift, notes, quantized, list(policy.sources), warnings, dict(looks))


def _covered_names(decision: Decision) -> str:
    """The point checks of a tier's decision (no interval; SETTLED_WHEN_FAILED), comma-separated."""
    return ", ".join(sorted(SETTLED_WHEN_FAILED & {c.name for c in decision.checks if c.interval is None}))


def _coverage(checks: list[Check], looks: TierLooks | None) -> list[Check]:
    """A tier settled PROMOTE before its last look: its point checks (a NaN, a wrong shape, the largest error: no
    interval, no error bound) say they covered the samples looked at only; the others never ran (issue 42)."""
    import dataclasses

    if looks is None or not looks.stopped_early or looks.verdict != PROMOTE:
        return checks
    covered = (f"on the {looks.samples_used} of {looks.samples_total} samples looked at (early stop); the other "
               f"{looks.samples_total - looks.samples_used} never ran: --no-early-stop checks every sample")
    return [dataclasses.replace(c, detail=f"{c.detail}; {covered}" if c.detail else covered)
            if c.interval is None and c.name in SETTLED_WHEN_FAILED else c for c in checks]


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
