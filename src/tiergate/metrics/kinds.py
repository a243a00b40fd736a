"""Task metrics of the output kinds (tiergate.outputs): what each kind is judged by, against labels when the
labels are of the kind's form, else against the FP32 reference's own decoded outputs (pseudo-labels: the
reference then scores perfectly by construction, and the candidate's value says how much of what FP32 finds
it still finds).

| kind | metrics | labels | default check with labels / without |
|---|---|---|---|
| detection (yolo, nms) | map (mAP@[.5:.95]), map50, recall50, precision50 | boxes | map >= 0.99 x FP32 / map50 >= 0.95 |
| detection (ssd) | anchor_recall, anchor_precision (anchors over score_threshold) | - | both >= 0.95 |
| map | mask_iou, dice | masks, or boxes drawn as masks | mask_iou >= 0.99 x FP32 / >= 0.95 |
| ctc | cer, wer, sequence_accuracy | texts | cer <= FP32's + 0.01 / <= 0.01 |
| landmarks | landmark_nme, landmark_error | points | landmark_nme <= FP32's + 0.01 / <= 0.01 |
| embedding | embedding_cosine, retrieval_agreement (pseudo), retrieval_precision (class labels) | class ids | retrieval_precision >= 0.99 x FP32 / embedding_cosine >= 0.99 |

Each is written as per-sample components and a statistic (the paired bootstrap resamples samples: images,
lines, ...); mAP's statistic recomputes pycocotools' accumulation for each resample (metrics.detection).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tiergate.labels import BoxLabels, is_texts
from tiergate.outputs.kind import OutputKind
from tiergate.outputs import decode

BY_KIND = {
    "detection": ("map", "map50", "recall50", "precision50"),
    "ssd": ("anchor_recall", "anchor_precision"),
    "map": ("mask_iou", "dice"),
    "ctc": ("cer", "wer", "sequence_accuracy"),
    "landmarks": ("landmark_nme", "landmark_error"),
    "embedding": ("embedding_cosine", "retrieval_agreement", "retrieval_precision"),
}
NAMES = tuple(name for names in BY_KIND.values() for name in names)
LOWER_IS_BETTER = ("cer", "wer", "landmark_nme", "landmark_error")
PSEUDO_ONLY = ("anchor_recall", "anchor_precision", "embedding_cosine", "retrieval_agreement")
LABELS_ONLY = ("retrieval_precision",)
# (with labels, without): the thresholds of a metric asked for by its output's kind alone; None: reported only
DEFAULTS: dict[str, tuple[dict | None, dict | None]] = {
    "map": ({"min_ratio": 0.99}, None), "map50": (None, {"min_ratio": 0.95}),
    "anchor_recall": (None, {"min_ratio": 0.95}), "anchor_precision": (None, {"min_ratio": 0.95}),
    "mask_iou": ({"min_ratio": 0.99}, {"min_ratio": 0.95}),
    "cer": ({"max_drop": 0.01}, {"max_drop": 0.01}),
    "landmark_nme": ({"max_drop": 0.01}, {"max_drop": 0.01}),
    "embedding_cosine": (None, {"min_ratio": 0.99}), "retrieval_precision": ({"min_ratio": 0.99}, None),
}


def family(kind: OutputKind) -> str:
    """The metrics' family of an output: its kind, "ssd" for an ssd's boxes, "" for what has no metrics of its own
    (class scores, values, an ssd's scores: judged with its boxes)."""
    if kind.kind == "detection":
        return {"ssd": "ssd", "ssd_scores": ""}.get(kind.layout, "detection")
    return kind.kind if kind.kind in BY_KIND else ""


@dataclass
class Judged:
    """Both sides of one kind metric: components and statistic each (Prepared-like), and what it was against."""

    cand: np.ndarray
    ref: np.ndarray
    statistic: object
    ref_statistic: object
    basis: str
    n: int
    same: bool = False            # the candidate's outputs are the reference's: one statistic, nothing to resample


def labels_fit(kind: OutputKind, labels, ref_output: np.ndarray) -> bool:
    """Whether `labels` are of the form `kind`'s metrics read (else they judge against FP32's outputs)."""
    if labels is None:
        return False
    k = family(kind)
    if k == "detection":
        return isinstance(labels, BoxLabels)
    if k == "map":
        if isinstance(labels, BoxLabels):
            return True
        masks = decode.masks(kind, ref_output[:1])
        return isinstance(labels, np.ndarray) and labels.dtype.kind in "biu" and \
            labels.size // max(len(labels), 1) == masks[0].size
    if k == "ctc":
        return is_texts(labels) and bool(kind.alphabet)
    if k == "landmarks":
        return isinstance(labels, np.ndarray) and labels.dtype.kind in "fiu" and \
            labels.size // max(len(labels), 1) in (kind.points * kind.dims, kind.points * 2)
    if k == "embedding":
        return isinstance(labels, np.ndarray) and labels.ndim == 1 and labels.dtype.kind in "iu"
    return False


def judge(name: str, kind: OutputKind, cand: dict, ref: dict, labels, cache: dict | None = None) -> Judged | None:
    """Components of `name` for the candidate and the reference on `kind`'s output; None where it cannot be
    computed on these labels (a labels-only metric without labels). `cache`: what the metrics of one output
    share (its decoded detections and their COCO matches), kept across the calls for its metrics."""
    out_c, out_r = cand[kind.output], ref[kind.output]
    with_labels = labels_fit(kind, labels, out_r)
    if (name in PSEUDO_ONLY and with_labels and family(kind) != "embedding") or \
            (name in LABELS_ONLY and not with_labels):
        return None
    basis = "labels" if with_labels and name not in PSEUDO_ONLY else "FP32's decoded outputs (no labels of this form)"
    truth_labels = labels if basis == "labels" else None
    fn = _JUDGES[family(kind)]
    judged = fn(name, kind, out_c, out_r, truth_labels, cand, ref, basis, {} if cache is None else cache)
    read = [kind.output] + ([kind.scores] if family(kind) == "ssd" else [])
    judged.same = all(np.array_equal(cand[o], ref[o]) for o in read)
    return judged


def _detection(name, kind, out_c, out_r, labels, cand, ref, basis, cache) -> Judged:
    from tiergate.metrics import detection

    key = ("detection", kind.output, labels is not None)
    if key not in cache:
        threshold = min(decode.RANK_SCORE, kind.score_threshold)
        dets_c, dets_r = decode.detections(kind, out_c, threshold), decode.detections(kind, out_r, threshold)
        if labels is not None:
            truth = [(b, c) for b, c in zip(labels.boxes, labels.categories)]
        else:
            truth = [(d.boxes, d.classes) for d in (x.above(kind.score_threshold) for x in dets_r)]
        cache[key] = (len(truth), [detection.Matches([(d.boxes, d.scores, d.classes) for d in dets], truth)
                                   for dets in (dets_c, dets_r)])
    n, sides = cache[key]
    if name in ("map", "map50"):
        index = np.arange(n, dtype=np.float64)[None]
        stats_ = [detection.ap_statistic(m, iou50=name == "map50") for m in sides]
        return Judged(index, index.copy(), stats_[0], stats_[1], basis, n)
    comps = [m.counts_at(kind.score_threshold) for m in sides]
    stat = detection.recall if name == "recall50" else detection.precision
    return Judged(comps[0], comps[1], stat, stat, basis, n)


def _ssd(name, kind, out_c, out_r, labels, cand, ref, basis, cache) -> Judged:
    hits_c, hits_r = decode.anchor_hits(kind, cand[kind.scores]), decode.anchor_hits(kind, ref[kind.scores])
    from tiergate.metrics import detection

    def counts(hits):
        return np.stack([(hits & hits_r).sum(axis=1), (hits & ~hits_r).sum(axis=1), hits_r.sum(axis=1)]).astype(float)
    stat = detection.recall if name == "anchor_recall" else detection.precision
    return Judged(counts(hits_c), counts(hits_r), stat, stat, basis, len(hits_r))


def _map(name, kind, out_c, out_r, labels, cand, ref, basis, cache) -> Judged:
    from tiergate.metrics import masks

    pred_c, pred_r = decode.masks(kind, out_c), decode.masks(kind, out_r)
    if labels is None:
        truth = pred_r
    elif isinstance(labels, BoxLabels):
        truth = masks.boxes_to_masks(labels.boxes, pred_r.shape[1:], kind.input_size)
    else:
        truth = np.asarray(labels).reshape(pred_r.shape)
        if pred_r.dtype == bool:
            truth = truth.astype(bool)
    classes = None if pred_r.dtype == bool else int(max(pred_r.max(initial=0), pred_c.max(initial=0),
                                                        np.asarray(truth).max(initial=0))) + 1
    stat = masks.iou if name == "mask_iou" else masks.dice
    return Judged(masks.components(pred_c, truth, classes), masks.components(pred_r, truth, classes), stat, stat,
                  basis, len(pred_r))


def _ctc(name, kind, out_c, out_r, labels, cand, ref, basis, cache) -> Judged:
    from tiergate.metrics import sequence

    text_c, text_r = decode.texts(kind, out_c), decode.texts(kind, out_r)
    truth = list(labels) if labels is not None else text_r
    if name == "sequence_accuracy":
        return Judged(sequence.exact_components(text_c, truth), sequence.exact_components(text_r, truth),
                      _mean0, _mean0, basis, len(truth))
    words = name == "wer"
    return Judged(sequence.error_components(text_c, truth, words), sequence.error_components(text_r, truth, words),
                  sequence.error_rate, sequence.error_rate, basis, len(truth))


def _landmarks(name, kind, out_c, out_r, labels, cand, ref, basis, cache) -> Judged:
    from tiergate.metrics import points

    pts_c, pts_r = decode.points(kind, out_c), decode.points(kind, out_r)
    if labels is None:
        truth = pts_r
    else:
        lab = np.asarray(labels, np.float64).reshape(len(labels), kind.points, -1)[:, :, :2]
        truth = lab
    scale = points.normalisers(truth, kind.normalize, kind.input_size) if name == "landmark_nme" else np.ones(len(truth))
    comps = [(points.point_errors(p, truth) / scale)[None] for p in (pts_c, pts_r)]
    return Judged(comps[0], comps[1], _mean0, _mean0, basis, len(truth))


def _embedding(name, kind, out_c, out_r, labels, cand, ref, basis, cache) -> Judged:
    from tiergate.metrics import points

    if name == "retrieval_precision":
        comps = [points.retrieval_precision(v, labels)[None] for v in (out_c, out_r)]
    elif name == "embedding_cosine":
        comps = [points.cosines(out_c, out_r)[None], np.ones((1, len(out_r)))]
    else:
        comps = [points.retrieval_agreement(out_c, out_r)[None], np.ones((1, len(out_r)))]
    return Judged(comps[0], comps[1], _mean0, _mean0, basis, len(out_r))


def _mean0(c, axis=-1):
    return np.mean(c[0], axis=axis)


_JUDGES = {"detection": _detection, "ssd": _ssd, "map": _map, "ctc": _ctc, "landmarks": _landmarks,
           "embedding": _embedding}
