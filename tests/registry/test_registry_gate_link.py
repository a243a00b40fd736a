"""A real gate decision (tiergate.gate.evaluate on real onnxruntime outputs) recorded, then reported.

What is under test is the registry link (checks, runs, metrics, aliases), not the runtimes: both
device classes' runs are host onnxruntime runs recorded under the catalogue's names, with a fixed
image id. The model pairs are chosen so the verdict is known before the gate runs:
"promote": the candidate holds the reference's weights (identical outputs, every check passes);
"reject": the candidate holds other random weights (about a third of the reference's top-1 answers,
far below the 99% accuracy ratio of the default policy).
"""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
import pytest
import modelkit as mk
from registry_kit import add
from tiergate import results
from tiergate.gate import RunOutcome, evaluate
from tiergate.metrics import compare_outputs
from tiergate.policy import load_policy
from tiergate.registry import NewRun, flat_metrics, record_gate_decision
from tiergate.registry.report_data import build_drift_report
from tiergate.targets import catalogue

CLASSES = ("x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime")


def _measured_run(model, x, device_class, emulated, folder):
    """Run per sample with onnxruntime, timing each call; save the result folder."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    outputs, latencies = [], []
    for row in x:
        started = time.perf_counter_ns()
        outputs.append(session.run(None, {"x": row[None]})[0])
        latencies.append(time.perf_counter_ns() - started)
    result = results.TargetResult(device_class=device_class, status="ok", emulated=emulated, n_samples=len(x),
                                  latencies_ns=latencies, image_id=f"sha256:{device_class}", data_sha256="d" * 64)
    out = {"y": np.concatenate(outputs)}
    results.save(result, folder, out)
    return RunOutcome(result, out)


CANDIDATE_SEED = {"promote": 3, "reject": 4}     # the reference is seed 3


@pytest.fixture(params=["promote", "reject"])
def gated(registry, tmp_path, request):
    fp32 = mk.write(mk.classifier(seed=3), tmp_path / "fp32.onnx")
    int8 = mk.write(mk.classifier(seed=CANDIDATE_SEED[request.param]), tmp_path / "candidate.onnx")
    x = np.random.default_rng(0).normal(size=(60, 4)).astype(np.float32)
    dcs = catalogue()
    reference = {dc: _measured_run(fp32, x, dc, dcs[dc].emulated, tmp_path / "ref" / dc) for dc in CLASSES}
    candidate = {dc: _measured_run(int8, x, dc, dcs[dc].emulated, tmp_path / "cand" / dc) for dc in CLASSES}
    labels = reference["x86_64-cpu-onnxruntime"].outputs["y"].argmax(1)
    decision = evaluate(candidate, reference, {dc: dcs[dc] for dc in CLASSES}, load_policy(), labels, quantized=True)
    sha = add(registry, int8).sha256
    runs = [NewRun.from_result(candidate[dc].result, folder=tmp_path / "cand" / dc) for dc in CLASSES]
    recorded = record_gate_decision(registry, sha, decision, runs=runs, cost_tags={"billing": "edge-fleet"})
    return registry, sha, decision, recorded, reference, candidate, labels, request.param


def test_decision_checks_and_verdict_are_recorded(gated):
    registry, sha, decision, recorded, *_, expected = gated
    assert decision.verdict.lower() == expected and recorded.verdict == expected
    failed = sorted((c.device_class, c.name) for c in decision.checks if not c.passed)
    if expected == "reject":
        assert ("x86_64-cpu-onnxruntime", "accuracy_ratio") in failed
        assert ("arm64-cpu-onnxruntime", "accuracy_ratio") in failed
    else:
        assert failed == []
    assert recorded.tiers == ["cortex-a", "x86-server"]
    stored = registry.decisions(artifact_sha=sha)[0]
    assert len(stored.checks) == len(decision.checks)
    assert [(c.name, c.device_class, c.passed, c.output) for c in stored.checks] == [
        (c.name, c.device_class, c.passed, c.output) for c in decision.checks]
    assert stored.reasons == decision.reasons and stored.detail["verdict"] == decision.verdict
    moved = registry.aliases("digits")
    assert moved == ({"cortex-a": sha, "x86-server": sha} if expected == "promote" else {})


def test_runs_carry_the_flat_metrics_computed_independently(gated):
    registry, sha, decision, recorded, reference, candidate, labels, _ = gated
    for dc in CLASSES:
        run = registry.runs(artifact_sha=sha, device_class=dc)[0]
        ref_y, cand_y = reference[dc].outputs["y"], candidate[dc].outputs["y"]
        drift = compare_outputs(ref_y, cand_y)
        assert run.metrics["cosine"] == pytest.approx(drift.cosine, rel=1e-12)
        assert run.metrics["max_abs_error"] == pytest.approx(float(np.max(np.abs(ref_y.astype(float) - cand_y))))
        assert run.metrics["accuracy"] == pytest.approx(np.mean(cand_y.argmax(1) == labels))
        ms = np.array(candidate[dc].result.latencies_ns) / 1e6
        assert run.metrics["latency_p50_ms"] == pytest.approx(np.percentile(ms, 50), rel=1e-6)
        assert run.tier == catalogue()[dc].tier
        assert run.metrics["emulated"] is (dc == "arm64-cpu-onnxruntime")
        assert (run.metrics["cost_per_1k"] is None) is (dc == "arm64-cpu-onnxruntime")  # no cost when emulated
        assert run.result_key and registry.find_cached_run(sha, dc, f"sha256:{dc}", "d" * 64).id == run.id
    assert flat_metrics({}) == {k: None for k in flat_metrics({})} | {"emulated": False}


def test_the_report_reads_what_the_gate_recorded(gated):
    registry, sha, decision, *_ = gated
    report = build_drift_report(registry, "digits")
    row = report["tiers"]["x86-server"]["rows"][0]
    assert row["artifact_sha"] == sha and row["decision"] == decision.verdict.lower()
    assert row["metrics"]["cosine"] == registry.runs(artifact_sha=sha, device_class=CLASSES[0])[0].metrics["cosine"]
    assert report["tiers"]["cortex-a"]["rows"][0]["emulated"] is True
