"""The decision cache key changes with anything a decision depends on; its files are JSON that must verify."""

from __future__ import annotations

import dataclasses
import json

from tiergate import orchestrator, results, state
from tiergate.orchestrator import deciding
from tiergate.evaldata import load_eval_data
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
    candidate = demo_set.candidate("onnx-int8-entropy").path
    intakes = {"candidate": orchestrator.intake(candidate), "reference": orchestrator.intake(demo_set.reference_onnx)}
    data = load_eval_data(demo_set.eval_data)
    dcs = resolve("x86_64-cpu-onnxruntime")
    policy = load_policy(None)

    def key(folders, classes=dcs, pol=policy):
        basis = orchestrator.Basis(intakes, tuple(classes), pol, data)
        return state.decision_key_of(orchestrator.decision_inputs(folders, basis))

    base = key(_folders(tmp_path / "a"))
    assert base == key(_folders(tmp_path / "a"))
    assert base != key(_folders(tmp_path / "c", latency=2000))
    stricter = dataclasses.replace(policy, defaults=dataclasses.replace(policy.defaults, min_cosine=0.999))
    assert base != key(_folders(tmp_path / "a"), pol=stricter)
    assert base != key(_folders(tmp_path / "a"), classes=[dataclasses.replace(dcs[0], cost_per_hour=9.0)])
    inputs = orchestrator.decision_inputs(_folders(tmp_path / "a"), orchestrator.Basis(intakes, tuple(dcs), policy, data))
    assert inputs["candidate"] == intakes["candidate"].sha256 and inputs["data"] == data.sha256


def test_saved_decision_round_trips_and_junk_is_ignored(tiergate_home, capsys):
    from tiergate.gate import Decision

    decision = Decision("PROMOTE", [], {}, {}, [], True, [])
    inputs = {"candidate": "a" * 64}
    path = state.save_decision("k1", inputs, decision.to_json())
    assert json.loads(path.read_text())["inputs"] == inputs            # JSON, naming its inputs
    assert deciding.cached_decision("k1", inputs) == decision
    assert deciding.cached_decision("k1", {"candidate": "b" * 64}) is None   # other inputs: refused and removed
    assert not path.exists()
    (tiergate_home / "decisions" / "k2.json").write_bytes(b"not json")
    assert deciding.cached_decision("k2", inputs) is None
    assert deciding.cached_decision("absent", inputs) is None
    assert "discarding the cached decision k2.json" in capsys.readouterr().err
    assert not list((tiergate_home / "decisions").glob("*.pickle"))
