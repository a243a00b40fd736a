"""Detection metrics by pycocotools' COCO evaluator: mAP@[0.5:0.95] and mAP@0.5 (COCO's 101-point interpolated
average precision, area "all"), recall and precision at IoU 0.5 for detections above a score threshold.

`evaluate(detections, truth)` runs pycocotools once (COCO.createIndex, COCOeval.evaluate and accumulate: the
point estimates are its own). The paired bootstrap resamples images: a resample is the same images with
multiplicities, and `Matches.average_precision(weights)` is COCOeval.accumulate's computation on pycocotools'
own per-image matches with each image's detections and ground truth counted as often as the image is drawn
(the same sort, cumulative sums, interpolation and recall thresholds; equal to pycocotools on the duplicated
images: tests/gate/test_detection_metrics.py). Recall and precision at IoU 0.5 are sums over images
(per-image counts), so their bootstrap is the usual vectorised one.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np

MAX_DETECTIONS = 300
_CHUNK = 4_000_000            # elements of a resample batch's (B, T, D) arrays


def _coco(images: list[int], annotations: list[dict], categories: list[int]):
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = {"images": [{"id": i} for i in images], "annotations": annotations,
                    "categories": [{"id": c} for c in categories]}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _annotations(per_image, with_scores: bool) -> list[dict]:
    out = []
    for image, (boxes, scores, classes) in enumerate(per_image):
        for j in range(len(boxes)):
            x, y, w, h = (float(v) for v in boxes[j])
            ann = {"id": len(out) + 1, "image_id": image, "bbox": [x, y, w, h], "area": max(w, 0.0) * max(h, 0.0),
                   "iscrowd": 0, "category_id": int(classes[j])}
            if with_scores:
                ann["score"] = float(scores[j])
            out.append(ann)
    return out


class Matches:
    """pycocotools' evaluation of one side's detections against the truth, kept for resampling."""

    def __init__(self, detections, truth):
        """`detections`: per image (boxes x y w h (k, 4), scores (k,), classes (k,)); `truth`: per image
        (boxes (g, 4), classes (g,))."""
        from pycocotools.cocoeval import COCOeval

        n = len(truth)
        classes = sorted({int(c) for _, c in truth for c in c} | {int(c) for _, _, cs in detections for c in cs}) or [0]
        gt = _coco(list(range(n)), _annotations([(b, None, c) for b, c in truth], False), classes)
        dt = _coco(list(range(n)), _annotations(detections, True), classes)
        self.n, self.classes = n, classes
        self.eval = COCOeval(gt, dt, iouType="bbox")
        p = self.eval.params
        p.imgIds, p.catIds = list(range(n)), classes
        p.areaRng, p.areaRngLbl = [[0.0, 1e10]], ["all"]
        p.maxDets = [MAX_DETECTIONS]
        with contextlib.redirect_stdout(io.StringIO()):
            self.eval.evaluate()
            self.eval.accumulate()
        self._stack()

    def _stack(self) -> None:
        """Every detection of every (category, image) in pycocotools' accumulate order, with its image."""
        self.per_class = []
        for k in range(len(self.classes)):
            records = [self.eval.evalImgs[k * self.n + i] for i in range(self.n)]
            kept = [(i, e) for i, e in enumerate(records) if e is not None]
            if not kept:
                self.per_class.append(None)
                continue
            scores = np.concatenate([e["dtScores"][:MAX_DETECTIONS] for _, e in kept]).astype(np.float64)
            order = np.argsort(-scores, kind="mergesort")
            image = np.concatenate([np.full(len(e["dtScores"][:MAX_DETECTIONS]), i) for i, e in kept])[order]
            matched = np.concatenate([e["dtMatches"][:, :MAX_DETECTIONS] for _, e in kept], axis=1)[:, order]
            ignored = np.concatenate([e["dtIgnore"][:, :MAX_DETECTIONS] for _, e in kept], axis=1)[:, order]
            gt_count = np.zeros(self.n)
            for i, e in kept:
                gt_count[i] = np.count_nonzero(np.asarray(e["gtIgnore"]) == 0)
            self.per_class.append((image.astype(np.int64), (matched > 0) & ~ignored.astype(bool),
                                   ~(matched > 0) & ~ignored.astype(bool), gt_count, scores[order]))

    def coco_average_precision(self, iou50: bool = False) -> float:
        """pycocotools' own: the mean of its accumulated precision over IoU thresholds (or IoU 0.5 alone),
        recall thresholds and categories, where defined (-1: a category without ground truth)."""
        precision = self.eval.eval["precision"][:, :, :, 0, 0]
        if iou50:
            precision = precision[:1]
        valid = precision[precision > -1]
        return float(valid.mean()) if valid.size else 0.0

    def average_precision(self, weights: np.ndarray, iou50: bool = False) -> np.ndarray:
        """accumulate's average precision with image i counted weights[..., i] times: (B,) for weights (B, n)."""
        weights = np.atleast_2d(np.asarray(weights, np.float64))
        total, count = np.zeros(len(weights)), np.zeros(len(weights))
        for entry in self.per_class:
            if entry is None:
                continue
            image, tps, fps, gt_count, _ = entry
            if iou50:
                tps, fps = tps[:1], fps[:1]
            step = max(1, _CHUNK // max(tps.size, 1))
            for start in range(0, len(weights), step):
                part = slice(start, start + step)
                q, defined = self._precision_at_recalls(weights[part], image, tps, fps, gt_count)
                total[part] += np.where(defined, q.sum(axis=(1, 2)), 0.0)
                count[part] += np.where(defined, q.shape[1] * q.shape[2], 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.where(count > 0, count, 1), 0.0)

    def _precision_at_recalls(self, weights, image, tps, fps, gt_count):
        """(B, T, R) interpolated precision at the recall thresholds, and (B,) whether the category has ground truth."""
        rec = np.asarray(self.eval.params.recThrs, np.float64)
        w = weights[:, image]                                             # (B, D)
        npig = weights @ gt_count                                         # (B,)
        tp = np.cumsum(w[:, None, :] * tps[None], axis=-1)                # (B, T, D)
        fp = np.cumsum(w[:, None, :] * fps[None], axis=-1)
        rc = tp / np.where(npig > 0, npig, 1)[:, None, None]
        pr = tp / (fp + tp + np.spacing(1))
        pr = np.maximum.accumulate(pr[..., ::-1], axis=-1)[..., ::-1]     # the interpolation envelope
        rows, depth = rc.shape[0] * rc.shape[1], rc.shape[2]
        if depth == 0:
            return np.zeros(rc.shape[:2] + (len(rec),)), npig > 0
        flat = rc.reshape(rows, depth)
        at = np.stack([np.searchsorted(row, rec, side="left") for row in flat])      # as accumulate, per row
        inside = at < depth
        q = np.where(inside, np.take_along_axis(pr.reshape(rows, depth), np.minimum(at, depth - 1), axis=1), 0.0)
        return q.reshape(rc.shape[:2] + (len(rec),)), npig > 0

    def counts_at(self, score_threshold: float) -> np.ndarray:
        """(3, n): per image, detections at or above the score matched at IoU 0.5, those unmatched, and the
        ground truth (recall = sum 0 / sum 2, precision = sum 0 / (sum 0 + sum 1))."""
        out = np.zeros((3, self.n))
        for entry in self.per_class:
            if entry is None:
                continue
            image, tps, fps, gt_count, scores = entry
            above = scores >= score_threshold
            np.add.at(out[0], image[above & tps[0]], 1)
            np.add.at(out[1], image[above & fps[0]], 1)
            out[2] += gt_count
        return out


def ap_statistic(matches: Matches, iou50: bool = False):
    """A vectorised statistic for stats.metric_ratio over components = the image index (1, n): the weights of a
    resample are the counts of each image in it."""
    def statistic(components, axis=-1):
        c = np.moveaxis(np.asarray(components), axis, -1)[0]          # (..., n) image indices
        flat = c.reshape(-1, c.shape[-1]).astype(np.int64)
        weights = np.stack([np.bincount(row, minlength=matches.n) for row in flat])
        values = matches.average_precision(weights, iou50)
        return values.reshape(c.shape[:-1]) if c.ndim > 1 else values[0]
    return statistic


def recall(c, axis=-1):
    tp, gt = np.sum(c[0], axis=axis), np.sum(c[2], axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(gt > 0, tp / np.where(gt > 0, gt, 1), 1.0)


def precision(c, axis=-1):
    tp, fp = np.sum(c[0], axis=axis), np.sum(c[1], axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tp + fp > 0, tp / np.where(tp + fp > 0, tp + fp, 1), 1.0)
