"""The gate judges each output by what it is (issue 41): every candidate, float or quantized, is held to output
agreement without labels; a detector's boxes and scores are judged apart; a kind's own metric decides against
labels of its form or against FP32's decoded outputs; a tier that nothing judges is INCONCLUSIVE, never PROMOTE."""

from __future__ import annotations

import numpy as np
import pytest

from tiergate.gate import INCONCLUSIVE, PROMOTE, REJECT, evaluate
from tiergate.labels import BoxLabels
from tiergate.metrics.drift import compare_outputs
from tiergate.outputs.kind import OutputKind
from tiergate.policy import load_policy

from tiergate.gate import RunOutcome
from tiergate.results import TargetResult
from tiergate.targets import DeviceClass

YOLO = OutputKind("out", "detection", "yolo", channels_first=True, box_format="cxcywh")


def _yolo(n=30, anchors=200, seed=0):
    """(N, 4 + 2, anchors): boxes in pixels (0..640) and two class scores; a few anchors score high per image."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, 6, anchors), np.float32)
    out[:, 0] = rng.uniform(20, 620, (n, anchors))
    out[:, 1] = rng.uniform(20, 620, (n, anchors))
    out[:, 2:4] = rng.uniform(10, 40, (n, 2, anchors))
    out[:, 4:] = rng.uniform(0, 0.06, (n, 2, anchors))
    hot = rng.random((n, anchors)) < 0.04
    out[:, 4][hot] = rng.uniform(0.5, 1.0, hot.sum())
    return out


def _gate(cand, ref, kinds, labels=None, policy=None, quantized=False):
    return evaluate({"x86": outcome("x86", cand)}, {"x86": outcome("x86", ref)}, _classes(),
                    policy or load_policy(None), labels, quantized=quantized, kinds=kinds)


def _classes():
    return {"x86": DeviceClass(name="x86", tier="x86-server", arch="amd64", runtime="onnxruntime",
                               runtime_version="1.31.1", threads=1, batch_size=1, execution="native",
                               docker_host="local", cost_per_hour=0.1)}


def outcome(device, outputs):
    n = len(next(iter(outputs.values())))
    return RunOutcome(TargetResult(device_class=device, status="ok", latencies_ns=[1_000_000] * n, n_samples=n),
                      outputs)


def test_a_detector_whose_scores_int8_destroyed_is_rejected_though_the_whole_output_agrees():
    ref = _yolo()
    cand = ref.copy()
    cand[:, 4:] = np.round(cand[:, 4:] / 2.5) * 2.5        # one int8 scale over boxes (0..640) and scores (0..1)
    whole = compare_outputs(ref, cand)
    assert whole.cosine > 0.99                             # one number over both says nothing is wrong
    decision = _gate({"out": cand}, {"out": ref}, {"out": YOLO})
    assert decision.verdict == REJECT
    failed = {c.label for c in decision.checks if not c.passed}
    assert "map50_ratio[out]" in failed
    metrics = decision.metrics["x86"]
    assert set(metrics.outputs) >= {"out", "out:boxes", "out:scores"}
    assert metrics.outputs["out:scores"].sqnr_db < 5 and metrics.outputs["out:boxes"].sqnr_db > 100
    assert any("sqnr_db[out:scores]" in w for w in decision.warnings)   # the parts' agreement: evidence here


def test_a_byte_different_copy_of_the_detector_is_promoted():
    ref = _yolo()
    decision = _gate({"out": ref.copy()}, {"out": ref}, {"out": YOLO})
    assert decision.verdict == PROMOTE
    assert decision.metrics["x86"].task["map50"].outcome == "pass"
    assert decision.metrics["x86"].kinds["out"].layout == "yolo"


def test_with_box_labels_the_detector_is_judged_by_coco_map_against_them():
    ref = _yolo(n=20)
    boxes, cats = [], []
    for sample in ref:                                     # the truth: the hot anchors' boxes, as x y w h
        hot = sample[4] >= 0.5
        cx, cy, w, h = sample[:4, hot]
        boxes.append(np.stack([cx - w / 2, cy - h / 2, w, h], axis=1).astype(np.float64))
        cats.append(np.zeros(int(hot.sum()), np.int64))
    labels = BoxLabels(tuple(boxes), tuple(cats))
    cand = ref.copy()
    cand[:, 4, :] *= 0.2                                   # every score under the 0.25 threshold, and ranked lower
    decision = _gate({"out": cand}, {"out": ref}, {"out": YOLO}, labels=labels)
    task = decision.metrics["x86"].task
    assert task["map"].reference > 0.9 and "map_ratio" in {c.name for c in decision.checks}
    assert task["recall50"].candidate < 0.1 < task["recall50"].reference


def test_a_float_candidate_without_labels_is_held_to_agreement():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(40, 8)).astype(np.float32)
    other = ref + rng.normal(0, 0.5, ref.shape).astype(np.float32)   # another network with the same signature
    decision = _gate({"y": other}, {"y": ref}, {"y": OutputKind("y", "values")}, quantized=False)
    assert decision.verdict == REJECT and {"cosine", "sqnr_db"} <= {c.name for c in decision.checks if not c.passed}
    same = _gate({"y": ref.copy()}, {"y": ref}, {"y": OutputKind("y", "values")})
    assert same.verdict == PROMOTE


def test_a_tier_nothing_judges_is_inconclusive_with_the_reason(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text("[defaults]\nmin_cosine = false\nmin_sqnr_db = false\n")
    ref = np.ones((30, 4), np.float32)
    decision = _gate({"y": ref * 7}, {"y": ref}, {}, policy=load_policy(policy))
    assert decision.verdict == INCONCLUSIVE
    check = next(c for c in decision.checks if c.name == "decided_by")
    assert check.inconclusive and "no check judged this tier's outputs" in check.detail


def test_landmarks_are_judged_by_their_error_not_by_cosine():
    rng = np.random.default_rng(1)
    ref = rng.uniform(40, 200, (30, 21 * 3)).astype(np.float32)
    lite = ref + rng.normal(0, 10, ref.shape).astype(np.float32)        # ~10 px off: cosine still ~0.99
    kind = OutputKind("pts", "landmarks", points=21, dims=3)
    decision = _gate({"pts": lite}, {"pts": ref}, {"pts": kind})
    assert decision.verdict == REJECT
    assert not next(c for c in decision.checks if c.name == "landmark_nme_difference").passed
    assert decision.metrics["x86"].task["landmark_error"].candidate > 5


@pytest.mark.parametrize("table, outcome_", [("max_drop = 0.2", "pass"), ("max_drop = false", "reported")])
def test_a_kind_metric_s_threshold_comes_from_the_policy(tmp_path, table, outcome_):
    rng = np.random.default_rng(1)
    ref = rng.uniform(40, 200, (30, 42)).astype(np.float32)
    cand = ref + rng.normal(0, 3, ref.shape).astype(np.float32)
    policy = tmp_path / "p.toml"
    policy.write_text(f"[metrics.landmark_nme]\n{table}\n")
    from tiergate.metrics.task import resolve

    specs = resolve([], load_policy(policy))
    decision = evaluate({"x86": outcome("x86", {"pts": cand})}, {"x86": outcome("x86", {"pts": ref})}, _classes(),
                        load_policy(policy), None, metrics=specs,
                        kinds={"pts": OutputKind("pts", "landmarks", points=21, dims=2)})
    assert decision.metrics["x86"].task["landmark_nme"].outcome == outcome_
