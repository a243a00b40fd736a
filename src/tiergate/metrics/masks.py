"""Masks against their truth: IoU and Dice over the data set's pixels (per class, then their mean, for class
maps), from per-sample intersections and unions so the paired bootstrap is vectorised; box labels are drawn
into masks at the output's resolution."""

from __future__ import annotations

import numpy as np


def boxes_to_masks(boxes, shape: tuple[int, int], input_size: tuple[int, ...] = ()) -> np.ndarray:
    """(N, H, W) bool: each sample's boxes (x, y, w, h in the input's pixels) filled, scaled to the mask's size."""
    h, w = shape
    sy, sx = (h / input_size[0], w / input_size[1]) if len(input_size) == 2 else (1.0, 1.0)
    out = np.zeros((len(boxes), h, w), bool)
    for i, sample in enumerate(boxes):
        for x, y, bw, bh in np.asarray(sample, np.float64).reshape(-1, 4):
            x0, y0 = int(np.floor(x * sx)), int(np.floor(y * sy))
            x1, y1 = int(np.ceil((x + bw) * sx)), int(np.ceil((y + bh) * sy))
            out[i, max(y0, 0):max(y1, 0), max(x0, 0):max(x1, 0)] = True
    return out


def components(predicted: np.ndarray, truth: np.ndarray, classes: int | None = None) -> np.ndarray:
    """(3C, n): per class and sample the pixels in both, in either, and in each (for Dice); C = 1 for masks of
    foreground (bool), else each class 0..C-1 present in either."""
    p, t = np.asarray(predicted), np.asarray(truth)
    n = len(t)
    p, t = p.reshape(n, -1), t.reshape(n, -1)
    if p.dtype == bool and t.dtype == bool:
        pairs = [(p, t)]
    else:
        count = classes or int(max(p.max(initial=0), t.max(initial=0))) + 1
        pairs = [(p == c, t == c) for c in range(count)]
    rows = []
    for a, b in pairs:
        rows.append([(a & b).sum(axis=1), (a | b).sum(axis=1), a.sum(axis=1) + b.sum(axis=1)])
    return np.asarray(rows, np.float64).transpose(1, 0, 2).reshape(3 * len(pairs), n)


def iou(c, axis=-1):
    k = c.shape[0] // 3
    inter, union = np.sum(c[:k], axis=axis), np.sum(c[k:2 * k], axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(union > 0, inter / np.where(union > 0, union, 1), np.nan)
    return _mean_defined(per_class)


def dice(c, axis=-1):
    k = c.shape[0] // 3
    inter, sizes = np.sum(c[:k], axis=axis), np.sum(c[2 * k:], axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(sizes > 0, 2 * inter / np.where(sizes > 0, sizes, 1), np.nan)
    return _mean_defined(per_class)


def _mean_defined(per_class):
    """The mean over classes present anywhere (a class in neither mask is left out; none present: agreement, 1)."""
    defined = ~np.isnan(per_class)
    total = np.where(defined, per_class, 0.0).sum(axis=0)
    count = defined.sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), 1.0)
