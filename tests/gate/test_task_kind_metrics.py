"""Each output kind's metric against its library's own computation: detection mAP by pycocotools' COCOeval
(summarize's stats), CER / WER by jiwer, mask IoU / Dice by scikit-learn, landmark error by scipy's distances,
embedding neighbours by scikit-learn's NearestNeighbors; and the bootstrap's resampled average precision equal
to pycocotools on the duplicated images."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from tiergate.metrics import detection, masks, points, sequence
from tiergate.metrics.kinds import judge
from tiergate.outputs import OutputKind


def _scene(rng, n, classes=3):
    """Random truth boxes per image and detections near them (some missed, some false), as (x, y, w, h)."""
    truth, dets = [], []
    for _ in range(n):
        g = int(rng.integers(0, 6))
        boxes = np.c_[rng.uniform(0, 300, (g, 2)), rng.uniform(8, 80, (g, 2))]
        cls = rng.integers(0, classes, g)
        truth.append((boxes, cls))
        pick = rng.random(g) < 0.8
        found = boxes[pick] + rng.normal(0, 3, (int(pick.sum()), 4))
        false = np.c_[rng.uniform(0, 300, (2, 2)), rng.uniform(8, 80, (2, 2))]
        b = np.vstack([found, false])
        b[:, 2:] = np.abs(b[:, 2:]) + 1
        dets.append((b, rng.uniform(0.05, 1.0, len(b)), np.r_[cls[pick], rng.integers(0, classes, 2)]))
    return dets, truth


def _cocoeval(dets, truth):
    """pycocotools as its users run it: default parameters, summarize()."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    classes = sorted({int(c) for _, cs in truth for c in cs} | {int(c) for _, _, cs in dets for c in cs})
    images = [{"id": i} for i in range(len(truth))]
    gt_anns, k = [], 1
    for i, (boxes, cls) in enumerate(truth):
        for b, c in zip(boxes, cls):
            gt_anns.append({"id": k, "image_id": i, "bbox": [float(v) for v in b], "area": float(b[2] * b[3]),
                            "iscrowd": 0, "category_id": int(c)})
            k += 1
    results = [{"image_id": i, "bbox": [float(v) for v in b], "score": float(s), "category_id": int(c)}
               for i, (boxes, scores, cls) in enumerate(dets) for b, s, c in zip(boxes, scores, cls)]
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO()
        gt.dataset = {"images": images, "annotations": gt_anns, "categories": [{"id": c} for c in classes]}
        gt.createIndex()
        ev = COCOeval(gt, gt.loadRes(results), iouType="bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_average_precision_is_pycocotools_own(seed):
    dets, truth = _scene(np.random.default_rng(seed), 25)
    stats = _cocoeval(dets, truth)
    matches = detection.Matches(dets, truth)
    assert matches.coco_average_precision() == pytest.approx(stats[0], abs=1e-12)
    assert matches.coco_average_precision(iou50=True) == pytest.approx(stats[1], abs=1e-12)
    ones = np.ones(len(truth))
    assert matches.average_precision(ones)[0] == pytest.approx(stats[0], abs=1e-12)
    assert matches.average_precision(ones, iou50=True)[0] == pytest.approx(stats[1], abs=1e-12)


def test_a_resample_s_average_precision_is_pycocotools_on_the_duplicated_images():
    rng = np.random.default_rng(7)
    dets, truth = _scene(rng, 20)
    matches = detection.Matches(dets, truth)
    weights = rng.integers(0, 4, (3, 20))
    resampled = matches.average_precision(weights)
    for row, value in zip(weights, resampled):
        dup_d = [d for d, k in zip(dets, row) for _ in range(k)]
        dup_t = [t for t, k in zip(truth, row) for _ in range(k)]
        assert value == pytest.approx(_cocoeval(dup_d, dup_t)[0], abs=1e-12)


def test_recall_and_precision_at_iou_half_count_pycocotools_matches():
    dets, truth = _scene(np.random.default_rng(3), 15)
    counts = detection.Matches(dets, truth).counts_at(0.5)
    # a direct count: a detection over the score matches a truth box of its class at IoU >= 0.5 (greedy by score)
    tp = fp = 0
    for (boxes, scores, cls), (tboxes, tcls) in zip(dets, truth):
        used = set()
        for j in np.argsort(-scores, kind="mergesort"):
            best, who = 0.5, None
            for t in range(len(tboxes)):
                if t in used or tcls[t] != cls[j]:
                    continue
                iou = _iou(boxes[j], tboxes[t])
                if iou >= best:
                    best, who = iou, t
            if who is not None:
                used.add(who)
            if scores[j] >= 0.5:
                tp, fp = tp + (who is not None), fp + (who is None)
    assert (counts[0].sum(), counts[1].sum(), counts[2].sum()) == (tp, fp, sum(len(b) for b, _ in truth))


def _iou(a, b):
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[0] + a[2], b[0] + b[2]), min(a[1] + a[3], b[1] + b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def test_cer_and_wer_are_jiwer_s():
    import jiwer

    truth = ["invoice total 1234", "due date", "thank you store", "receipt", "card number 77"]
    hyp = ["invoice tota 1234", "due dat", "thank you stor e", "", "card numbr 77"]
    chars = sequence.error_components(hyp, truth)
    words = sequence.error_components(hyp, truth, words=True)
    assert float(sequence.error_rate(chars)) == pytest.approx(jiwer.cer(truth, hyp), abs=1e-12)
    assert float(sequence.error_rate(words)) == pytest.approx(jiwer.wer(truth, hyp), abs=1e-12)
    assert sequence.exact_components(hyp, truth).sum() == 0


def test_mask_iou_and_dice_are_scikit_learn_s():
    from sklearn.metrics import f1_score, jaccard_score

    rng = np.random.default_rng(0)
    truth = rng.random((6, 16, 16)) < 0.3
    pred = truth ^ (rng.random((6, 16, 16)) < 0.1)
    c = masks.components(pred, truth)
    assert float(masks.iou(c)) == pytest.approx(jaccard_score(truth.ravel(), pred.ravel()), abs=1e-12)
    assert float(masks.dice(c)) == pytest.approx(f1_score(truth.ravel(), pred.ravel()), abs=1e-12)
    classes_t, classes_p = rng.integers(0, 3, (6, 8, 8)), rng.integers(0, 3, (6, 8, 8))
    c = masks.components(classes_p, classes_t, 3)
    assert float(masks.iou(c)) == pytest.approx(
        jaccard_score(classes_t.ravel(), classes_p.ravel(), average="macro"), abs=1e-12)


def test_boxes_are_drawn_as_masks_at_the_output_s_resolution():
    drawn = masks.boxes_to_masks([np.array([[8.0, 4.0, 16.0, 8.0]])], (16, 16), (32, 32))
    assert drawn[0].sum() == 8 * 4 and drawn[0, 2:6, 4:12].all()


def test_landmark_error_is_scipy_s_euclidean_distance():
    from scipy.spatial.distance import euclidean

    rng = np.random.default_rng(0)
    truth, pred = rng.uniform(0, 200, (4, 21, 2)), rng.uniform(0, 200, (4, 21, 2))
    errors = points.point_errors(pred, truth)
    for i in range(4):
        assert errors[i] == pytest.approx(np.mean([euclidean(pred[i, j], truth[i, j]) for j in range(21)]))
    extent = truth.max(axis=1) - truth.min(axis=1)
    assert points.normalisers(truth, "bbox") == pytest.approx(np.hypot(extent[:, 0], extent[:, 1]))


def test_embedding_cosine_and_neighbours_are_scipy_and_scikit_learn_s():
    from scipy.spatial.distance import cosine
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(30, 16)), rng.normal(size=(30, 16))
    assert points.cosines(a, b) == pytest.approx([1 - cosine(x, y) for x, y in zip(a, b)])
    near = NearestNeighbors(n_neighbors=6, metric="cosine").fit(a).kneighbors(a, return_distance=False)[:, 1:]
    assert (np.sort(points.neighbours(a, 5), axis=1) == np.sort(near, axis=1)).all()


def test_ctc_judged_against_labels_and_against_fp32_s_own_text():
    alphabet = ("", "a", "b", "c")
    kind = OutputKind("probs", "ctc", alphabet=alphabet, alphabet_size=4)
    def one_hot(seq):
        out = np.full((len(seq), 4), 0.01, np.float32)
        out[np.arange(len(seq)), seq] = 0.97
        return out
    ref = np.stack([one_hot([1, 1, 0, 2, 3]), one_hot([3, 0, 3, 3, 0])])      # "abc", "cc"
    cand = np.stack([one_hot([1, 0, 0, 2, 3]), one_hot([3, 0, 0, 3, 0])])     # "abc", "cc"
    worse = np.stack([one_hot([1, 0, 0, 0, 3]), one_hot([2, 0, 0, 3, 0])])    # "ac", "bc"
    labels = np.array(["abc", "cc"])
    got = judge("cer", kind, {"probs": worse}, {"probs": ref}, labels)
    assert got.basis == "labels" and float(sequence.error_rate(got.cand)) == pytest.approx(2 / 5)
    assert float(sequence.error_rate(got.ref)) == 0
    pseudo = judge("cer", kind, {"probs": cand}, {"probs": ref}, None)
    assert pseudo.basis.startswith("FP32") and float(sequence.error_rate(pseudo.cand)) == 0
