"""Small helpers every part of the gate shares: comparing a value with its threshold, labels' shapes, the
output labels are scored against, how figures are written in a check's detail."""

from __future__ import annotations

import math

import numpy as np

from tiergate.errors import InputError
from tiergate.evaldata import is_class_indices
from tiergate.fmt import number
from tiergate.labels import is_ragged
from tiergate.metrics.accuracy import Estimate, is_classifier
from tiergate.metrics.latency import LatencyStats
from tiergate.metrics.task import MetricSpec
from tiergate.policy import Thresholds


def compare(value, op: str, threshold) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return {">=": value >= threshold, "<=": value <= threshold, ">": value > threshold,
            "==": value == threshold}[op]


def plain(value):
    return value.item() if isinstance(value, np.generic) else value


def pct(est: Estimate) -> str:
    return f"{est.value:.2%} [{est.low:.2%}, {est.high:.2%}]"


def fmt(value) -> str:
    return number(value, 6, missing="None")


def failure(outcome, who: str) -> str:
    if outcome.ok:
        return ""
    if outcome.result.ok:
        return f"{who} run has no saved outputs"
    return f"{who} run failed: {outcome.result.reason or 'no reason recorded'}"


def same_shape(outcome, name: str, ref) -> bool:
    out = (outcome.outputs or {}).get(name)
    return out is not None and out.shape == ref.outputs[name].shape


def untrusted(lat: LatencyStats | None, name: str, t: Thresholds) -> str:
    if lat is None:
        return ""
    if lat.unstable:
        return f"unstable run: CoV {lat.cov:.2f} > {t.max_latency_cov}; rerun on a quieter machine"
    if name == "latency_p99_ms" and not lat.p99_reliable:
        return f"only {lat.n_calls} calls; p99 needs at least {t.p99_min_samples}"
    return ""


def task_threshold(spec: MetricSpec, default_ratio: float | None) -> tuple[str, float | None]:
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
    if spec.explicit_off:
        return op, None
    return op, (default_ratio if threshold is None and op == ">=" else threshold)


# -- labels ---------------------------------------------------------------------------------
def check_label_array(labels):
    """Labels as the gate reads them: numbers with the sample axis first, texts (a 1-D unicode array), boxes
    (tiergate.labels.BoxLabels); anything else is an InputError. Negative numbers are no class indices
    (class_labels): only a metric that reads them (a user metric) is computed from them."""
    if labels is None or is_ragged(labels):
        return labels
    labels = np.asarray(labels)
    if labels.ndim == 0 or not (np.issubdtype(labels.dtype, np.number) or labels.dtype == np.bool_):
        raise InputError(f"labels must be numbers, texts or boxes with the sample axis first, got shape "
                         f"{labels.shape} dtype {labels.dtype}")
    return labels


def class_labels(labels) -> bool:
    """One class index per sample (evaldata.is_class_indices: none negative)."""
    return is_class_indices(labels)


def check_labels_fit(labels: np.ndarray, output: np.ndarray, name: str) -> None:
    if len(labels) != len(output):
        raise InputError(f"labels: {len(labels)} labels but output '{name}' holds {len(output)} samples")
    classes = output.size // max(len(output), 1)
    if labels.size and labels.max() >= classes:
        raise InputError(f"labels: label {labels.max()} but output '{name}' has only {classes} scores per sample")


def pick_label_output(outputs: dict[str, np.ndarray], wanted: str | None, labels, specs=(),
                      carried=frozenset(), kinds=None) -> str | None:
    """The output labels are scored against: named, else the first with two or more scores per sample that
    is not a carried state (an output shaped as one of the model's inputs, fed back: silero's stateN) nor of
    another kind than class scores (tiergate.outputs: a detector's, a map, a sequence, landmarks...)."""
    if wanted is not None:
        if wanted not in outputs:
            raise InputError(f"label output '{wanted}' is not a model output (outputs: {', '.join(outputs)})")
        return wanted
    kinds = kinds or {}

    def scores(name: str, out: np.ndarray) -> bool:
        kind = kinds.get(name)
        return name not in carried and is_classifier(out) and (kind is None or kind.kind in ("class_scores", "values"))
    name = next((name for name, out in outputs.items() if scores(name, out)), None)
    only_top1 = all(s.kind == "top1" for s in specs)
    judged_by_kind = any(k.kind not in ("class_scores", "values") for k in kinds.values())
    if name is None and class_labels(labels) and only_top1 and not judged_by_kind:
        raise InputError("labels given, but no model output has two or more scores per sample "
                         "(for other tasks name a metric: [metrics.NAME] in the policy or --metric)")
    return name

