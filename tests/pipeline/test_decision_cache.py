"""The decision cache key changes with anything a decision depends on."""

from __future__ import annotations

import dataclasses

from tiergate import pipeline, results
from tiergate.policy import load_policy
from tiergate.results import TargetResult
from tiergate.targets import resolve


def _folders(tmp_path, latency: int = 1000):
    folders = {}
    for role in ("candidate", "reference"):
        folder = tmp_path / role
        results.save(TargetResult("x86_64-cpu-onnxruntime", "ok", latencies_ns=[latency]), folder)
        folders[(role, "x86_64-cpu-onnxruntime")] = folder
    return folders


def test_key_follows_results_policy_and_classes(demo_set, tmp_path, tiergate_home):
    intakes = {"candidate": pipeline.intake(demo_set.candidate("onnx-int8-entropy").path)}
    dcs = resolve("x86_64-cpu-onnxruntime")
    policy = load_policy(None)
    key = pipeline.decision_key(_folders(tmp_path / "a"), intakes, dcs, policy)
    assert key == pipeline.decision_key(_folders(tmp_path / "b"), intakes, dcs, policy)
    assert key != pipeline.decision_key(_folders(tmp_path / "c", latency=2000), intakes, dcs, policy)
    stricter = dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, min_cosine=0.999))
    assert key != pipeline.decision_key(_folders(tmp_path / "a"), intakes, dcs, stricter)
    pricier = [dataclasses.replace(dcs[0], cost_per_hour=9.0)]
    assert key != pipeline.decision_key(_folders(tmp_path / "a"), intakes, pricier, policy)


def test_saved_decision_round_trips_and_junk_is_ignored(tiergate_home):
    from tiergate.gate import Decision

    decision = Decision("PROMOTE", [], {}, {}, [], True, [])
    pipeline.save_decision("k1", decision)
    assert pipeline.cached_decision("k1").verdict == "PROMOTE"
    (tiergate_home / "decisions" / "k2.pickle").write_bytes(b"not a pickle")
    assert pipeline.cached_decision("k2") is None
    assert pipeline.cached_decision("absent") is None
