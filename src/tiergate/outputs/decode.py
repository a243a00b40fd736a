"""Outputs decoded into what they mean: detections, masks, texts, points, and the parts of a detector's output
that agreement judges apart. numpy only; each function reads one output's (or two outputs') stacked arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tiergate.outputs.kind import OutputKind

MAX_DETECTIONS = 300          # per image, after NMS (ultralytics' max_det)
RANK_SCORE = 0.05             # the least score of a detection ranked for average precision (mmdetection's
                              # score_thr for COCO evaluation; a lower one ranks many boxes that change nothing)


# --- parts --------------------------------------------------------------------------------------------


def parts(kind: OutputKind, array: np.ndarray) -> dict[str, np.ndarray]:
    """The parts of one output that mean different things, (N, ...) each; {} when it is one thing."""
    if kind.kind != "detection" or array.ndim != 3:
        return {}
    if kind.layout in ("yolo", "yolo_objectness"):
        a = array if kind.channels_first else np.swapaxes(array, 1, 2)
        if kind.layout == "yolo":
            return {"boxes": a[:, :4], "scores": a[:, 4:]}
        return {"boxes": a[:, :4], "objectness": a[:, 4:5], "scores": a[:, 5:]}
    if kind.layout == "nms" and array.shape[2] >= 6:
        skip = array.shape[2] - 6
        return {"boxes": array[..., skip:skip + 4], "scores": array[..., skip + 4], "classes": array[..., skip + 5]}
    if kind.layout == "ssd" and array.shape[2] > 4:
        return {"boxes": array[..., :4], "keypoints": array[..., 4:]}
    return {}


# --- detections -----------------------------------------------------------------------------------------


@dataclass
class Detections:
    """One image's detections: boxes (k, 4) as x, y, width, height (COCO's bbox), scores (k,), classes (k,)."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    def above(self, threshold: float) -> "Detections":
        keep = self.scores >= threshold
        return Detections(self.boxes[keep], self.scores[keep], self.classes[keep])


def _as_probability(scores: np.ndarray) -> np.ndarray:
    """Scores as probabilities: logits (any value outside [0, 1]) through a sigmoid."""
    scores = np.asarray(scores, np.float64)
    if scores.size and (scores.min() < 0 or scores.max() > 1):
        with np.errstate(over="ignore"):
            return 1.0 / (1.0 + np.exp(-scores))
    return scores


def _xywh(boxes: np.ndarray, fmt: str) -> np.ndarray:
    b = np.asarray(boxes, np.float64)
    if fmt == "cxcywh":
        return np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 2], b[:, 3]], axis=1)
    if fmt == "xyxy":
        return np.stack([b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]], axis=1)
    if fmt == "yxyx":
        return np.stack([b[:, 1], b[:, 0], b[:, 3] - b[:, 1], b[:, 2] - b[:, 0]], axis=1)
    return b


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float, limit: int) -> np.ndarray:
    """Indices kept by greedy class-aware non-maximum suppression (boxes x, y, w, h), best score first."""
    order = np.argsort(-scores, kind="stable")
    x1, y1 = boxes[:, 0], boxes[:, 1]
    x2, y2 = x1 + boxes[:, 2], y1 + boxes[:, 3]
    area = np.maximum(boxes[:, 2], 0) * np.maximum(boxes[:, 3], 0)
    keep: list[int] = []
    while order.size and len(keep) < limit:
        i = order[0]
        keep.append(int(i))
        rest = order[1:]
        w = np.clip(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0, None)
        h = np.clip(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0, None)
        inter = w * h
        with np.errstate(invalid="ignore", divide="ignore"):
            overlap = np.where(area[i] + area[rest] - inter > 0, inter / (area[i] + area[rest] - inter), 0.0)
        order = rest[(overlap <= iou) | (classes[rest] != classes[i])]
    return np.asarray(keep, np.int64)


def detections(kind: OutputKind, array: np.ndarray, threshold: float = RANK_SCORE) -> list[Detections]:
    """Each image's detections with a score of at least `threshold`, after NMS (yolo) or as the graph's NMS
    left them (nms). An ssd layout has no decoded boxes: see anchor_hits."""
    out = []
    for sample in np.asarray(array, np.float64):
        if kind.layout in ("yolo", "yolo_objectness"):
            a = sample if kind.channels_first else sample.T                  # (channels, anchors)
            start = 5 if kind.layout == "yolo_objectness" else 4
            cls_scores = _as_probability(a[start:])
            if kind.layout == "yolo_objectness":
                cls_scores = cls_scores * _as_probability(a[4:5])
            classes = cls_scores.argmax(axis=0) if len(cls_scores) else np.zeros(a.shape[1], np.int64)
            scores = cls_scores.max(axis=0) if len(cls_scores) else np.zeros(a.shape[1])
            keep = scores >= threshold
            boxes = _xywh(a[:4, keep].T, kind.box_format or "cxcywh")
            scores, classes = scores[keep], classes[keep]
            kept = nms(boxes, scores, classes, kind.iou_threshold, MAX_DETECTIONS)
            out.append(Detections(boxes[kept], scores[kept], classes[kept].astype(np.int64)))
        else:                                                                 # nms: rows of x1 y1 x2 y2 score class
            skip = sample.shape[1] - 6
            rows = sample[:, skip:]
            keep = (rows[:, 4] >= max(threshold, 1e-12)) & np.isfinite(rows).all(axis=1)
            out.append(Detections(_xywh(rows[keep, :4], kind.box_format or "xyxy"), rows[keep, 4],
                                  rows[keep, 5].astype(np.int64)))
    return out


def anchor_hits(kind: OutputKind, scores: np.ndarray) -> np.ndarray:
    """ssd: per image and anchor, whether the best class's score (a sigmoid of logits) clears score_threshold,
    (N, A) bool; without the anchors' geometry this is what can be compared."""
    s = _as_probability(np.asarray(scores).reshape(len(scores), -1, np.asarray(scores).shape[-1]))
    return s.max(axis=-1) >= kind.score_threshold


# --- maps, sequences, points ---------------------------------------------------------------------------


def masks(kind: OutputKind, array: np.ndarray) -> np.ndarray:
    """(N, H, W): foreground (probability >= threshold) or each pixel's class (argmax over C)."""
    a = np.asarray(array)
    channel = 1 if kind.channels_first else 3
    if kind.layout == "classes" and a.shape[channel] > 1:
        return a.argmax(axis=channel)
    return np.take(a, 0, axis=channel) >= kind.threshold


def texts(kind: OutputKind, array: np.ndarray) -> list:
    """Greedy CTC decoding: the best symbol per step, repeats merged, blanks dropped; a str per sample with an
    alphabet, else a tuple of symbol indices."""
    best = np.asarray(array).argmax(axis=-1)
    out = []
    for row in best:
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != kind.blank
        symbols = row[keep]
        if kind.alphabet:
            out.append("".join(kind.alphabet[i] if i < len(kind.alphabet) else "\ufffd" for i in symbols))
        else:
            out.append(tuple(int(i) for i in symbols))
    return out


def points(kind: OutputKind, array: np.ndarray) -> np.ndarray:
    """(N, P, 2): each point's x and y."""
    a = np.asarray(array, np.float64).reshape(len(array), -1)
    dims = kind.dims or 2
    count = kind.points or a.shape[1] // dims
    return a[:, :count * dims].reshape(len(a), count, dims)[:, :, :2]
