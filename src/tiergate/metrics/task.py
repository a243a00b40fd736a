"""Task metrics against labels, compared candidate vs FP32 reference on the same tier.

Built-in metrics (names as in the policy's `[metrics.NAME]` tables and `--metric NAME`):

  top1_accuracy, topK_accuracy (e.g. top5_accuracy)   classifier scores, integer labels
  precision, recall, f1, roc_auc                      binary: one score per sample (>= threshold is
                                                      positive) or class scores (argmax == positive)
  mean_iou                                            segmentation: class scores per pixel, or one
                                                      score per pixel (>= threshold), vs label masks
  mae, rmse                                           regression: output vs labels, same size per sample

and user metrics, `--metric FILE.py:FUNCTION`: FUNCTION(outputs, labels), higher is better, where
outputs is {output name: array stacked per sample}; reported under FUNCTION's name. It returns one
number for the whole set (then called again per bootstrap resample, within a time budget), or per-sample
values (n numbers, or {"numerator": ..., "denominator": ...} per sample: custom_result), from which the
interval is computed as for a built-in metric.

Every built-in metric is written as per-sample components and a statistic over them, so a
paired bootstrap resamples samples once for the candidate and the reference together,
vectorised (tiergate.stats.metric_ratio).
"""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiergate.errors import InputError
from tiergate.metrics.kinds import LOWER_IS_BETTER as _KIND_LOWER, NAMES as KIND_METRICS

LOWER_IS_BETTER = ("mae", "rmse") + _KIND_LOWER
BINARY = ("precision", "recall", "f1", "roc_auc")
_FIXED = ("top1_accuracy", "mean_iou", "mae", "rmse") + BINARY + KIND_METRICS
_TOPK = re.compile(r"^top(\d+)_accuracy$")
TABLE_KEYS = ("min_ratio", "max_ratio", "max_drop", "output", "k", "threshold", "positive")
DEFAULT_MAX_ERROR_RATIO = 1.05


@dataclass(frozen=True)
class MetricSpec:
    name: str                      # reported name: built-in name or the custom function's
    kind: str                      # top1, topk, precision, recall, f1, roc_auc, mean_iou, mae, rmse, custom
    output: str | None = None      # the model output it reads (default: picked per kind)
    k: int = 1
    threshold: float = 0.5
    positive: int = 1
    min_ratio: float | None = None     # candidate / reference >= this (higher-is-better metrics)
    max_ratio: float | None = None     # candidate / reference <= this (errors)
    max_drop: float | None = None      # a difference instead of a ratio: candidate >= reference - this
    source: str = ""                   # FILE.py:FUNCTION of a custom metric
    explicit_off: bool = False         # the policy switched its threshold off (`false`): reported only
    source_sha256: str = ""
    code_sha256: str = ""              # the metric file, the local modules it imports, its folder (metric_code)
    code_files: tuple[str, ...] = ()   # the local modules it imports that lie outside its folder
    implicit: bool = False             # the default top-1 check (min_accuracy_ratio), not asked for by name
    fn: Callable | None = field(default=None, compare=False, repr=False)

    @property
    def higher_is_better(self) -> bool:
        return self.kind not in LOWER_IS_BETTER

    @property
    def identity(self) -> str:
        """What the decision depends on (the decision cache's key names it)."""
        return json.dumps({k: v for k, v in self.__dict__.items() if k != "fn"}, sort_keys=True)


def builtin(name: str, table: dict | None = None) -> MetricSpec:
    table = dict(table or {})
    match = _TOPK.match(name)
    if match:
        kind, k = ("top1" if match.group(1) == "1" else "topk"), int(match.group(1))
    elif name in _FIXED:
        kind, k = name, 1
    else:
        raise InputError(f"metric '{name}' is not built in (built in: {', '.join(_FIXED)}, topK_accuracy); "
                         "a metric of your own is --metric FILE.py:FUNCTION")
    off = any(table.get(key) is False for key in ("min_ratio", "max_ratio", "max_drop"))
    table = {key: (None if value is False else value) for key, value in table.items()}
    _one_form(name, table)
    if kind in ("top1", "topk") and table.get("max_drop") is not None:
        raise InputError(f"policy: [metrics.{name}] max_drop: accuracy is a proportion (never negative) judged "
                         "as a ratio to the reference; use min_ratio")
    if kind in ("mae", "rmse") and table.get("max_ratio") is None and table.get("max_drop") is None and not off:
        table["max_ratio"] = DEFAULT_MAX_ERROR_RATIO
    return MetricSpec(name, kind, table.get("output"), int(table.get("k", k)), float(table.get("threshold", 0.5)),
                      int(table.get("positive", 1)), table.get("min_ratio"), table.get("max_ratio"),
                      table.get("max_drop"), explicit_off=off)


def _one_form(name: str, table: dict) -> None:
    """A metric is judged as a ratio (min_ratio / max_ratio) or as a difference (max_drop), not both."""
    ratios = [key for key in ("min_ratio", "max_ratio") if table.get(key) is not None]
    if table.get("max_drop") is not None and ratios:
        raise InputError(f"policy: [metrics.{name}] sets both max_drop and {ratios[0]}: a metric is judged as a "
                         "difference (max_drop) or as a ratio, not both")


def resolve(names: list[str], policy) -> list[MetricSpec]:
    """The implicit top-1 check, the policy's [metrics.NAME] tables, then --metric names (built-in or files)."""
    from tiergate.dataloader import load_function
    from tiergate.evaldata import is_loader
    from tiergate.hashing import file_sha256

    tables = dict(getattr(policy, "metrics", {}) or {})
    specs: dict[str, MetricSpec] = {}
    for name in names:
        if is_loader(name):
            before = set(sys.modules)
            fn = load_function(name, "metric")
            fname, file = name.rpartition(":")[2], name.rpartition(":")[0]
            table = tables.get(fname, {})
            off = any(table.get(key) is False for key in ("min_ratio", "max_ratio", "max_drop"))
            table = {key: (None if value is False else value) for key, value in table.items()}
            _one_form(fname, table)
            code_sha, code_files = metric_code(Path(file), fn, set(sys.modules) - before)
            specs[fname] = MetricSpec(fname, "custom", table.get("output"), min_ratio=table.get("min_ratio"),
                                      max_ratio=table.get("max_ratio"), max_drop=table.get("max_drop"), source=name,
                                      source_sha256=file_sha256(file), code_sha256=code_sha,
                                      code_files=code_files, fn=fn, explicit_off=off)
        else:
            specs[name] = builtin(name, tables.get(name))
    for name, table in tables.items():
        if name in specs:
            continue
        if _TOPK.match(name) or name in _FIXED:
            specs[name] = builtin(name, table)
        else:
            raise InputError(f"policy: [metrics.{name}] names no built-in metric and no --metric FILE.py:{name} "
                             f"was given (built in: {', '.join(_FIXED)}, topK_accuracy)")
    if "top1_accuracy" not in specs:
        specs = {"top1_accuracy": MetricSpec("top1_accuracy", "top1", implicit=True), **specs}
    return list(specs.values())


def metric_code(file: Path, fn, new_modules) -> tuple[str, tuple[str, ...]]:
    """(the hash of a user metric's code, the imported module files outside its folder): the metric file, every
    module imported while it was (`new_modules`) or named in its namespace whose file is neither the standard
    library's nor an installed package's (outside sys.prefix and sys.base_prefix) nor tiergate's own, and the
    regular files of its folder (hashing.metric_code_sha256)."""
    from tiergate.hashing import metric_code_sha256

    names = set(new_modules)
    namespace = getattr(fn, "__globals__", {})
    for value in namespace.values():
        module = value if isinstance(value, types.ModuleType) else sys.modules.get(getattr(value, "__module__", None)
                                                                                   or "")
        if module is not None:
            names.add(module.__name__)
    folder = file.resolve().parent
    outside = set()
    for name in names:
        path = _local_module_file(sys.modules.get(name))
        if path is not None and not path.is_relative_to(folder):
            outside.add(str(path))
    files = tuple(sorted(outside))
    return metric_code_sha256(file, files), files


_PACKAGE = Path(__file__).resolve().parents[1]


def _local_module_file(module) -> Path | None:
    """A module's source file when it is the user's own: not stdlib, site-packages, or tiergate itself."""
    where = getattr(module, "__file__", None)
    if not where:
        return None
    path = Path(where).resolve()
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if any(path.is_relative_to(p) for p in prefixes) or path.is_relative_to(_PACKAGE) or not path.is_file():
        return None
    return path


# --- per-sample components and statistics ------------------------------------------------------------


@dataclass
class Prepared:
    """One side's per-sample components (c, n) and the statistic that turns them into the metric."""

    components: np.ndarray
    statistic: Callable          # statistic(components (c, ..., n), axis=-1) -> metric (...)
    vectorised: bool = True


def prepare(spec: MetricSpec, output: np.ndarray, labels: np.ndarray) -> Prepared:
    """Components of one side for a built-in metric; InputError when output and labels cannot fit."""
    kind = spec.kind
    if kind in ("top1", "topk"):
        return Prepared(_topk_hits(spec, output, labels)[None, :], _mean_of(0))
    if kind in BINARY:
        score, predicted = _binary(spec, output)
        truth = _binary_truth(spec, labels)
        if kind == "roc_auc":
            return Prepared(np.stack([score, truth]), _auc)
        tp, fp, fn = predicted & truth, predicted & ~truth, ~predicted & truth
        return Prepared(np.stack([tp, fp, fn]).astype(np.float64), _BINARY_STATS[kind])
    if kind == "mean_iou":
        return Prepared(_iou_components(spec, output, labels), _mean_iou)
    if kind in LOWER_IS_BETTER:
        err = _errors(spec, output, labels)
        return Prepared((np.abs(err) if kind == "mae" else err ** 2).mean(axis=1)[None, :],
                        _mean_of(0) if kind == "mae" else _rmse)
    raise InputError(f"metric '{spec.name}': unknown kind {kind}")


def value(prepared: Prepared) -> float:
    return float(prepared.statistic(prepared.components, axis=-1))


def _mean_of(row: int):
    def statistic(c, axis=-1):
        return np.mean(c[row], axis=axis)
    return statistic


def _rmse(c, axis=-1):
    return np.sqrt(np.mean(c[0], axis=axis))


def _precision(c, axis=-1):
    tp, fp = c[0].sum(axis=axis), c[1].sum(axis=axis)
    return _div(tp, tp + fp)


def _recall(c, axis=-1):
    tp, fn = c[0].sum(axis=axis), c[2].sum(axis=axis)
    return _div(tp, tp + fn)


def _f1(c, axis=-1):
    tp, fp, fn = (c[i].sum(axis=axis) for i in range(3))
    return _div(2 * tp, 2 * tp + fp + fn)


_BINARY_STATS = {"precision": _precision, "recall": _recall, "f1": _f1}


def _div(a, b):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), 0.0)


def _auc(c, axis=-1):
    """ROC AUC from ranks (Mann-Whitney U / n1 n0; ties get mid-ranks), over the last axis."""
    from scipy.stats import rankdata

    score, truth = np.moveaxis(c[0], axis, -1), np.moveaxis(c[1], axis, -1)
    ranks = rankdata(score, axis=-1)
    n1 = truth.sum(axis=-1)
    n0 = truth.shape[-1] - n1
    u = (ranks * truth).sum(axis=-1) - n1 * (n1 + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n1 > 0) & (n0 > 0), u / np.maximum(n1 * n0, 1), np.nan)


def _mean_iou(c, axis=-1):
    half = c.shape[0] // 2
    inter, union = c[:half].sum(axis=axis), c[half:].sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1), np.nan)
        return np.nanmean(iou, axis=0)


def _topk_hits(spec: MetricSpec, output: np.ndarray, labels: np.ndarray) -> np.ndarray:
    scores = np.asarray(output, dtype=np.float64).reshape(len(output), -1)
    labels = _int_labels(spec, labels, scores.shape[1])
    if spec.k > scores.shape[1]:
        raise InputError(f"metric '{spec.name}': k = {spec.k} but the output has {scores.shape[1]} scores per sample")
    if spec.k == 1:
        return (scores.argmax(axis=1) == labels).astype(np.float64)
    top = np.argpartition(-scores, spec.k - 1, axis=1)[:, :spec.k]
    return (top == labels[:, None]).any(axis=1).astype(np.float64)


def _int_labels(spec: MetricSpec, labels: np.ndarray, classes: int) -> np.ndarray:
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise InputError(f"metric '{spec.name}': labels must be one class index per sample, got "
                         f"{labels.dtype}{list(labels.shape)}")
    if labels.size and labels.max() >= classes:
        raise InputError(f"metric '{spec.name}': label {labels.max()} but the output has {classes} scores "
                         "per sample")
    return labels


def _binary(spec: MetricSpec, output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(output, dtype=np.float64).reshape(len(output), -1)
    if scores.shape[1] == 1:
        score = scores[:, 0]
        return score, score >= spec.threshold
    if spec.positive >= scores.shape[1]:
        raise InputError(f"metric '{spec.name}': positive class {spec.positive} but the output has "
                         f"{scores.shape[1]} scores per sample")
    return scores[:, spec.positive], scores.argmax(axis=1) == spec.positive


def _binary_truth(spec: MetricSpec, labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels).reshape(len(labels), -1)
    if labels.shape[1] != 1:
        raise InputError(f"metric '{spec.name}': labels must be one value per sample, got shape "
                         f"{list(labels.shape)}")
    if np.issubdtype(labels.dtype, np.integer) or labels.dtype == np.bool_:
        return labels[:, 0].astype(np.int64) == spec.positive
    return labels[:, 0] >= 0.5


def _iou_components(spec: MetricSpec, output: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per sample and class: pixels in both (intersection), then in either (union): (2C, n)."""
    out = np.asarray(output)
    labels = np.asarray(labels)
    n, mask_shape = len(labels), labels.shape[1:]
    per_sample = out.reshape(n, -1).shape[1]
    if per_sample == int(np.prod(mask_shape)):             # one score per pixel: foreground at the threshold
        pred, classes = (out.reshape(labels.shape) >= spec.threshold).astype(np.int64), 2
    elif out.shape[2:] == mask_shape:                       # (n, C, H, W)
        pred, classes = out.argmax(axis=1), out.shape[1]
    elif out.shape[1:-1] == mask_shape:                     # (n, H, W, C)
        pred, classes = out.argmax(axis=-1), out.shape[-1]
    else:
        raise InputError(f"metric '{spec.name}': output {list(out.shape)} does not fit label masks "
                         f"{list(labels.shape)} (class scores per pixel, or one score per pixel)")
    truth = labels.astype(np.int64)
    classes = max(classes, int(truth.max()) + 1 if truth.size else 0)
    pred, truth = pred.reshape(n, -1), truth.reshape(n, -1)
    inter = np.stack([((pred == c) & (truth == c)).sum(axis=1) for c in range(classes)])
    union = np.stack([((pred == c) | (truth == c)).sum(axis=1) for c in range(classes)])
    return np.concatenate([inter, union]).astype(np.float64)


def _errors(spec: MetricSpec, output: np.ndarray, labels: np.ndarray) -> np.ndarray:
    out = np.asarray(output, dtype=np.float64).reshape(len(output), -1)
    ref = np.asarray(labels, dtype=np.float64).reshape(len(labels), -1)
    if out.shape != ref.shape:
        raise InputError(f"metric '{spec.name}': output has {out.shape[1]} values per sample, labels "
                         f"{ref.shape[1]}")
    return out - ref


def pick_output(spec: MetricSpec, outputs: dict[str, np.ndarray], labels: np.ndarray | None,
                classifier: str | None) -> str | None:
    """The output a metric reads: the named one, else by kind (classifier output, or the first that fits)."""
    if spec.output is not None:
        if spec.output not in outputs:
            raise InputError(f"metric '{spec.name}': output '{spec.output}' is not a model output "
                             f"(outputs: {', '.join(outputs)})")
        return spec.output
    if spec.kind in ("top1", "topk"):
        return classifier
    if spec.kind in BINARY:
        for name, out in outputs.items():
            if out.size // max(len(out), 1) in (1, 2):
                return name
        return classifier
    if labels is not None and spec.kind in LOWER_IS_BETTER + ("mean_iou",):
        size = labels.size // max(len(labels), 1)
        for name, out in outputs.items():
            per = out.size // max(len(out), 1)
            if per == size or (spec.kind == "mean_iou" and per % max(size, 1) == 0):
                return name
    return next(iter(outputs), None)


def custom_value(spec: MetricSpec, outputs: dict[str, np.ndarray], labels, worker=None) -> float:
    """A user metric's value on the whole set: user code run with limits (tiergate.usercode: sys.exit, stdout, a
    timeout; on `worker`'s thread when given); one clear error naming it when it raises, exits, hangs or returns
    anything but a finite real number."""
    from tiergate import usercode

    what = custom_name(spec)
    raw = worker.call(spec.fn, outputs, labels) if worker is not None else \
        usercode.call(what, spec.fn, outputs, labels)
    return usercode.real_number(what, raw)


def custom_name(spec: MetricSpec) -> str:
    return f"metric {spec.name} ({spec.source})"


PER_SAMPLE_PARTS = ("numerator", "denominator")


def custom_result(spec: MetricSpec, raw, n: int) -> float | Prepared:
    """What a user metric returned for n samples: one finite number (the metric of the whole set: its interval
    calls it once per bootstrap resample), or per-sample values, from which the interval is computed without
    calling it again (one pass over the data): a sequence of n finite numbers (the metric is their mean), or
    {"numerator": n values, "denominator": n values} (the metric is the sum of the numerators over the sum of the
    denominators: an IoU from each sample's intersection and union, an error rate from each sample's edits and
    characters). Anything else is one clear error naming the metric."""
    from tiergate import usercode

    what = custom_name(spec)
    if isinstance(raw, dict):
        if sorted(raw) != sorted(PER_SAMPLE_PARTS):
            raise InputError(f"{what}: returned a mapping with keys {sorted(map(str, raw))}; per-sample parts are "
                             f"{{'numerator': [n values], 'denominator': [n values]}}")
        parts = np.stack([_per_sample(what, raw[key], n, key) for key in PER_SAMPLE_PARTS])
        if (parts[1] < 0).any() or parts[1].sum() <= 0:
            raise InputError(f"{what}: its denominators must be at least 0 and not all 0 (their sum is "
                             f"{parts[1].sum():.6g})")
        return Prepared(parts, _ratio_of_sums)
    if isinstance(raw, (list, tuple)) or (isinstance(raw, np.ndarray) and raw.ndim >= 1 and raw.size != 1):
        return Prepared(_per_sample(what, raw, n, "values")[None, :], _mean_of(0))
    return usercode.real_number(what, raw)


def _per_sample(what: str, values, n: int, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or len(array) != n or array.dtype.kind not in "biuf":
        raise InputError(f"{what}: its per-sample {name} must be {n} real numbers, one per sample (got "
                         f"{array.dtype}{list(array.shape)})")
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise InputError(f"{what}: its per-sample {name} hold {int((~np.isfinite(array)).sum())} value(s) that are "
                         "not finite numbers")
    return array


def _ratio_of_sums(c, axis=-1):
    return _div(c[0].sum(axis=axis), c[1].sum(axis=axis))


def refuse_ratio_of_nonpositive(spec: MetricSpec, values: dict[str, float]) -> None:
    """A ratio to the reference means nothing when a value is negative (a mean log-probability: a worse
    candidate gets a ratio above 1) or the reference's is zero: such a metric is judged as a difference,
    `max_drop`. A candidate at zero beside a positive reference is a ratio of 0: a REJECT of a higher-is-better
    metric, not an error (a user metric judged by a ratio is taken to be non-negative)."""
    for side, number in values.items():
        if number < 0 or (number == 0 and side == "reference"):
            raise InputError(f"metric {spec.name} ({spec.source or 'built in'}): the {side}'s value is {number:.6g}; "
                             f"a ratio threshold cannot judge a metric that can be zero or negative: set "
                             f"[metrics.{spec.name}] max_drop = D (the candidate may be at most D below the "
                             "reference) instead of min_ratio / max_ratio")
