"""Task metrics candidate vs FP32 reference: values checked against scikit-learn, intervals, user metrics,
agreement as evidence, and the exact JSON round trip of the new fields."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn import metrics as skm

from tiergate.errors import InputError
from tiergate.gate import Decision, TaskMetric, evaluate
from tiergate.metrics import task
from tiergate.policy import load_policy
from tiergate.stats import Interval


def _policy(tmp_path, text: str):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return load_policy(path)


def _value(name, output, labels, **table):
    return task.value(task.prepare(task.builtin(name, table), output, labels))


def test_builtin_values_match_scikit_learn():
    rng = np.random.default_rng(0)
    scores = rng.random((300, 6))
    labels = rng.integers(0, 6, 300)
    top3 = skm.top_k_accuracy_score(labels, scores, k=3, labels=range(6))
    assert _value("top3_accuracy", scores, labels) == pytest.approx(top3)
    assert _value("top1_accuracy", scores, labels) == pytest.approx(skm.accuracy_score(labels, scores.argmax(1)))
    p = rng.random(300)
    y = (p + rng.normal(0, 0.3, 300) > 0.5).astype(np.int64)
    assert _value("roc_auc", p[:, None], y) == pytest.approx(skm.roc_auc_score(y, p))
    for name, fn in (("precision", skm.precision_score), ("recall", skm.recall_score), ("f1", skm.f1_score)):
        assert _value(name, p[:, None], y, threshold=0.6) == pytest.approx(fn(y, p >= 0.6))
    masks = rng.integers(0, 3, (20, 8, 8))
    logits = rng.random((20, 3, 8, 8)) + 2.0 * np.eye(3)[masks].transpose(0, 3, 1, 2) * (rng.random((20, 1, 8, 8)) < .7)
    expected = skm.jaccard_score(masks.ravel(), logits.argmax(1).ravel(), average="macro")
    assert _value("mean_iou", logits, masks) == pytest.approx(expected)
    target = rng.normal(size=(50, 3))
    pred = target + rng.normal(0, 0.1, target.shape)
    assert _value("mae", pred, target) == pytest.approx(skm.mean_absolute_error(target, pred))
    assert _value("rmse", pred, target) == pytest.approx(np.sqrt(skm.mean_squared_error(target, pred)))


def _outcomes(make_outcome, cand, ref, name="out"):
    return {"x86": make_outcome("x86", {name: cand})}, {"x86": make_outcome("x86", {name: ref})}


def test_binary_metrics_gate_with_intervals(make_outcome, device_classes, tmp_path):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 800)
    ref = np.clip(y * 0.6 + rng.random(800) * 0.5, 0, 1).astype(np.float32)[:, None]
    worse = np.where(rng.random((800, 1)) < 0.3, 1 - ref, ref).astype(np.float32)      # 30% of samples flipped
    policy = _policy(tmp_path, "[metrics.f1]\nmin_ratio = 0.98\n[metrics.roc_auc]\nmin_ratio = 0.98\n")
    specs = task.resolve([], policy)
    same = evaluate(*_outcomes(make_outcome, ref, ref), {"x86": device_classes["x86"]}, policy, y, metrics=specs)
    assert same.verdict == "PROMOTE", same.reasons
    assert same.metrics["x86"].task["f1"].ratio.method == "degenerate"
    bad = evaluate(*_outcomes(make_outcome, worse, ref), {"x86": device_classes["x86"]}, policy, y, metrics=specs)
    f1 = next(c for c in bad.checks if c.name == "f1_ratio")
    assert bad.verdict == "REJECT" and not f1.passed and not f1.inconclusive and f1.interval.high < 0.98
    assert bad.metrics["x86"].task["roc_auc"].candidate < bad.metrics["x86"].task["roc_auc"].reference


def test_custom_metric_from_a_file_is_gated_by_its_policy_table(make_outcome, device_classes, tmp_path):
    (tmp_path / "m.py").write_text(
        "import numpy as np\n"
        "def mean_score(outputs, labels):\n    return float(np.mean(outputs['out']))\n"
        "def explodes(outputs, labels):\n    raise KeyError('logits')\n"
        "def nan(outputs, labels):\n    return float('nan')\n")
    rng = np.random.default_rng(2)
    ref = rng.random((200, 1)).astype(np.float32) + 1
    policy = _policy(tmp_path, "[metrics.mean_score]\nmin_ratio = 0.999\n")
    specs = task.resolve([f"{tmp_path}/m.py:mean_score"], policy)
    decision = evaluate(*_outcomes(make_outcome, ref * 0.9, ref), {"x86": device_classes["x86"]}, policy, None,
                        metrics=specs)
    check = next(c for c in decision.checks if c.name == "mean_score_ratio")
    assert check.threshold == 0.999 and check.value == pytest.approx(0.9, rel=1e-5) and not check.passed
    assert decision.metrics["x86"].task["mean_score"].source.endswith("m.py:mean_score")
    for fn, message in (("explodes", "metric explodes (" ), ("nan", "returned nan, not a finite number")):
        with pytest.raises(InputError, match=message.replace("(", r"\(")):
            evaluate(*_outcomes(make_outcome, ref, ref), {"x86": device_classes["x86"]}, load_policy(), None,
                     metrics=task.resolve([f"{tmp_path}/m.py:{fn}"], load_policy()))


def test_unknown_metric_names_are_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="metric 'top_accuracy' is not built in"):
        task.resolve(["top_accuracy"], load_policy())
    with pytest.raises(InputError, match=r"\[metrics.mystery\] names no built-in metric"):
        task.resolve([], _policy(tmp_path, "[metrics.mystery]\nmin_ratio = 0.9\n"))
    with pytest.raises(InputError, match="on_inconclusive must be one of"):
        _policy(tmp_path, '[defaults]\non_inconclusive = "maybe"\n')


def test_with_labels_agreement_is_evidence_unless_the_policy_gates_it(make_outcome, device_classes, tmp_path,
                                                                      classifier_data, to_probs):
    logits, labels = classifier_data
    ref = to_probs(logits)
    coarse = (np.round(ref * 8) / 8).astype(np.float32)           # same argmax mostly, low SQNR
    outcomes = _outcomes(make_outcome, coarse, ref, "probs")
    classes = {"x86": device_classes["x86"]}
    evidence = evaluate(*outcomes, classes, load_policy(), labels, quantized=True)
    assert not any(c.name in ("cosine", "sqnr_db") for c in evidence.checks)
    assert any("sqnr_db[probs]" in w and "evidence only" in w for w in evidence.warnings)
    gated = evaluate(*outcomes, classes, _policy(tmp_path, '[defaults]\nagreement = "gate"\n'), labels, quantized=True)
    assert not next(c for c in gated.checks if c.name == "sqnr_db").passed and gated.verdict == "REJECT"
    unlabelled = evaluate(*outcomes, classes, load_policy(), None, quantized=True)
    assert any(c.name == "sqnr_db" for c in unlabelled.checks)       # without labels agreement decides


def test_intervals_and_task_metrics_round_trip_exactly(make_outcome, device_classes, tmp_path):
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 4, 300)
    ref = np.eye(4, dtype=np.float32)[np.where(rng.random(300) < 0.9, labels, (labels + 1) % 4)]
    cand = ref.copy()
    cand[:6] = np.roll(cand[:6], 1, axis=1)
    policy = _policy(tmp_path, "[metrics.top2_accuracy]\nmin_ratio = 0.99\n")
    decision = evaluate(*_outcomes(make_outcome, cand, ref, "probs"), {"x86": device_classes["x86"]}, policy,
                        labels, metrics=task.resolve([], policy))
    back = Decision.from_json(json.loads(json.dumps(decision.to_json(), allow_nan=False)))
    assert back == decision
    check = next(c for c in back.checks if c.name == "accuracy_ratio")
    assert isinstance(check.interval, Interval) and check.interval == next(
        c for c in decision.checks if c.name == "accuracy_ratio").interval
    doc = decision.to_json()
    top1 = next(c for c in doc["checks"] if c["name"] == "accuracy_ratio")
    assert {"low", "high", "confidence", "method"} <= set(top1["interval"])
    assert isinstance(back.metrics["x86"].task["top2_accuracy"], TaskMetric)
    assert back.metrics["x86"].task["top2_accuracy"].ratio == decision.metrics["x86"].task["top2_accuracy"].ratio
    assert back.warnings == decision.warnings


def test_a_difference_interval_of_identical_values_is_a_point(make_outcome, device_classes, tmp_path):
    (tmp_path / "m.py").write_text("import numpy as np\ndef lp(outputs, labels):\n"
                                   "    return float(np.mean(np.log(outputs['out'])))\n")
    policy_file = tmp_path / "p.toml"
    policy_file.write_text("[metrics.lp]\nmax_drop = 0.01\n")
    policy = load_policy(policy_file)
    out = np.random.default_rng(0).random((100, 1)).astype(np.float32) * 0.5 + 0.1
    outcome = {"x86": make_outcome("x86", {"out": out})}
    decision = evaluate(outcome, outcome, {"x86": device_classes["x86"]}, policy, None,
                        metrics=task.resolve([f"{tmp_path}/m.py:lp"], policy))
    check = next(c for c in decision.checks if c.name == "lp_difference")
    assert check.passed and check.value == 0.0 and decision.verdict == "PROMOTE"
