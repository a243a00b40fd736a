"""Typed results with an exact JSON round trip: from_json(to_json(x)) == x, NaN and infinities included."""

from __future__ import annotations

import json
import math

import numpy as np

from tiergate.gate import ABResult, Check, Decision, DriftMatrix, TargetMetrics, evaluate
from tiergate.metrics.drift import OutputDrift
from tiergate.metrics.latency import LatencyStats
from tiergate.policy import load_policy
from tiergate.stats import Interval, McNemar



def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)


def _through_text(decision: Decision) -> Decision:
    text = json.dumps(decision.to_json(), allow_nan=False)     # strict JSON: no NaN/Infinity literals
    return Decision.from_json(json.loads(text))


def test_decision_round_trips_exactly_with_nan_and_inf(device_classes, make_outcome, classifier_data):
    logits, labels = classifier_data
    ref = {name: make_outcome(name, {"probs": softmax(logits), "raw": logits.astype(np.float32)})
           for name in device_classes}
    broken = logits.astype(np.float32).copy()
    broken[0, 0] = np.nan                                       # a NaN in one output: non-finite metrics
    cand = {name: make_outcome(name, {"probs": softmax(logits * 0.9), "raw": broken}, seed=1)
            for name in device_classes}
    inc = {name: make_outcome(name, {"probs": softmax(logits * 1.1), "raw": logits.astype(np.float32)}, seed=2)
           for name in device_classes}
    decision = evaluate(cand, ref, device_classes, load_policy(None), labels, inc, quantized=True)
    back = _through_text(decision)

    assert back == decision and back.dumps() == decision.dumps()
    assert back.verdict == decision.verdict == "REJECT"
    x86 = back.metrics["x86"]
    assert isinstance(x86, TargetMetrics) and isinstance(x86.outputs["raw"], OutputDrift)
    assert math.isnan(x86.outputs["raw"].sqnr_db) and math.isnan(decision.metrics["x86"].outputs["raw"].sqnr_db)
    assert isinstance(x86.latency["candidate"], LatencyStats)
    assert isinstance(x86.ab, ABResult) and isinstance(x86.ab.mcnemar, McNemar)
    assert isinstance(x86.ab.accuracy_difference, Interval)
    assert x86.ab.accuracy_difference == decision.metrics["x86"].ab.accuracy_difference
    assert isinstance(back.drift["candidate"], DriftMatrix)
    assert back.drift["candidate"].pairs.keys() == decision.drift["candidate"].pairs.keys()
    assert all(isinstance(c, Check) for c in back.checks) and back.checks[0] == decision.checks[0]
    assert back.reasons == decision.reasons


def test_infinite_values_and_strings_keep_their_types():
    checks = [Check("x86", "x86-server", "sqnr_db", math.inf, 20.0, ">=", True),
              Check("x86", "x86-server", "cosine", -math.inf, 0.99, ">=", False),
              Check("x86", "x86-server", "run", "failed", "ok", "==", False, detail="crashed"),
              Check("x86", "x86-server", "finite", 0, 0, "==", True, output="y")]
    decision = Decision("REJECT", checks, {}, {}, ["a note"], False, ["default"])
    doc = decision.to_json()
    assert doc["checks"][0]["value"] == "inf" and doc["checks"][1]["value"] == "-inf"
    back = _through_text(decision)
    assert back == decision
    assert back.checks[0].value == math.inf and back.checks[1].value == -math.inf
    assert back.checks[2].value == "failed" and back.checks[3].value == 0 and isinstance(back.checks[3].value, int)


def test_other_schema_is_refused():
    import pytest

    from tiergate.errors import InputError

    doc = Decision("PROMOTE", [], {}, {}, [], False, []).to_json()
    doc["schema"] = 1
    with pytest.raises(InputError, match="schema 1"):
        Decision.from_json(doc)


def test_target_result_device_figures_round_trip_through_the_result_folder(tmp_path):
    """result.json keeps the typed device figures (op profile included) and the OOM limit exactly."""
    from tiergate import results
    from tiergate.results import DeviceFigures, NodeTime, OpProfile, OpTime, TargetResult

    profile = OpProfile(True, "onnxruntime profiling JSON", "", 20,
                        {"Conv": OpTime(1.5, 40, 2), "Relu": OpTime(0.25, 40, 2)},
                        [NodeTime("c1", "Conv", 1.0, "CPUExecutionProvider"), NodeTime("c2", "Conv", 0.5)])
    figures = DeviceFigures(61_000_000, 49_000_000, 9_000_000, 400_000, None, "/proc/self/status VmHWM",
                            3.25, 0.5, 2135, True, profile)
    ok = TargetResult("arm", "ok", tier="cortex-a", emulated=True, latencies_ns=[10, 12], device=figures)
    oom = TargetResult("x86", "failed", reason="out of memory", oom_limit_bytes=64 * 1024 * 1024)
    for result in (ok, oom):
        folder = results.save(result, tmp_path / result.device_class)
        json.loads((folder / results.RESULT_FILE).read_text())      # plain JSON on disk
        back = results.load(folder)
        assert back == result and type(back.device) is type(result.device)
    assert results.load(tmp_path / "arm").device.op_profile.by_op_type["Conv"] == OpTime(1.5, 40, 2)
    old = {k: v for k, v in ok.to_json().items() if k not in ("device", "oom_limit_bytes")}
    assert TargetResult.from_json(old).device is None                 # a result from an older harness still loads
