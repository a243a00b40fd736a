"""A real gate decision recorded, then reported: the orchestrator gates tiny models for real on x86_64 and
emulated arm64 (real containers, real QEMU), `orchestrator.record` records it, and the tests check the registry link
(checks, runs, metrics, aliases) against figures computed here from the saved outputs. The model pairs are chosen
so the verdict is known before the gate runs:
"promote": the candidate holds the reference's weights (identical outputs, every check passes);
"reject": the candidate holds other random weights (about a third of the reference's top-1 answers,
far below the 99% accuracy ratio of the default policy).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import modelkit as mk
from registry_kit import add
import gatekit
from tiergate import orchestrator
from tiergate.metrics import compare_outputs
from tiergate.policy import load_policy
from tiergate.registry import flat_metrics
from tiergate.registry.report_data import build_drift_report
from tiergate.targets import catalogue, resolve

CLASSES = ("x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime")
CANDIDATE_SEED = {"promote": 3, "reject": 4}     # the reference is seed 3
pytestmark = [pytest.mark.docker, pytest.mark.emulated, pytest.mark.slow]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Models, data and one TIERGATE_HOME for the module: each input runs once, later gates reuse it."""
    folder = tmp_path_factory.mktemp("gate-link")
    fp32 = mk.write(mk.classifier(seed=3), folder / "fp32.onnx")
    x = np.random.default_rng(0).normal(size=(400, 4)).astype(np.float32)
    import onnxruntime as ort

    labels = ort.InferenceSession(str(fp32)).run(None, {"x": x})[0].argmax(1).astype(np.int64)
    np.savez(folder / "eval.npz", x=x, labels=labels)
    previous = os.environ.get("TIERGATE_HOME")
    os.environ["TIERGATE_HOME"] = str(folder / "home")
    yield folder, fp32, labels
    if previous is None:
        os.environ.pop("TIERGATE_HOME", None)
    else:
        os.environ["TIERGATE_HOME"] = previous


@pytest.fixture(params=["promote", "reject"])
def gated(registry, shared, request):
    folder, fp32, labels = shared
    int8 = mk.write(mk.classifier(seed=CANDIDATE_SEED[request.param]), folder / f"candidate-{request.param}.onnx")
    sha = add(registry, int8).sha256
    # every sample on every tier (the metrics below are recomputed on the whole file)
    run = gatekit.gate(int8, fp32, folder / "eval.npz", resolve(list(CLASSES)), load_policy(), early_stop=False)
    recorded = orchestrator.record(registry, run, cost_tags={"billing": "edge-fleet"})
    reference, candidate = run.outcomes["reference"], run.outcomes["candidate"]
    return registry, sha, run.decision, recorded, reference, candidate, labels, request.param


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
        result = candidate[dc].result
        assert run.machine == ("aarch64" if dc.startswith("arm64") else "x86_64")      # really run there
        assert run.result_key and registry.find_cached_run(sha, dc, result.image_id, result.data_sha256).id == run.id
    assert flat_metrics({}) == {k: None for k in flat_metrics({})} | {"emulated": False}


def test_the_report_reads_what_the_gate_recorded(gated):
    registry, sha, decision, *_ = gated
    report = build_drift_report(registry, "digits")
    row = report["tiers"]["x86-server"]["rows"][0]
    assert row["artifact_sha"] == sha and row["decision"] == decision.verdict.lower()
    assert row["metrics"]["cosine"] == registry.runs(artifact_sha=sha, device_class=CLASSES[0])[0].metrics["cosine"]
    assert report["tiers"]["cortex-a"]["rows"][0]["emulated"] is True
