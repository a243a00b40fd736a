"""Device-figure checks of the gate: absolute limits, ratios to the reference and the incumbent, emulated
classes, OOM findings, policy parsing (saved results built in memory; the figures are set by hand)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tiergate.errors import InputError
from tiergate.gate import Decision, evaluate
from tiergate.metrics.device import FIGURES, ratios
from tiergate.policy import load_policy
from tiergate.results import MB, DeviceFigures, NodeTime, OpProfile, OpTime



def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)


def figures(peak_mb=100.0, load_ms=20.0, first_ms=5.0, artifact_mb=2.0, profile=None) -> DeviceFigures:
    return DeviceFigures(peak_memory_bytes=int(peak_mb * MB), baseline_memory_bytes=int(40 * MB),
                         load_memory_bytes=int((peak_mb - 50) * MB), inference_memory_bytes=int(10 * MB),
                         cgroup_peak_bytes=int((peak_mb + 8) * MB), memory_source="/proc/self/status VmHWM",
                         load_ms=load_ms, first_inference_ms=first_ms, artifact_bytes=int(artifact_mb * MB),
                         op_profile=profile)


def _with(outcome, device=None, **fields):
    outcome.result = dataclasses.replace(outcome.result, device=device, **fields)
    return outcome


def _policy(tmp_path, text: str):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return load_policy(path)


@pytest.fixture
def runs(device_classes, make_outcome, classifier_data):
    logits, _ = classifier_data

    def make(cand_fig, ref_fig, inc_fig=None):
        cand = {n: _with(make_outcome(n, {"probs": softmax(logits)}, emulated=device_classes[n].emulated), cand_fig)
                for n in device_classes}
        ref = {n: _with(make_outcome(n, {"probs": softmax(logits)}, emulated=device_classes[n].emulated), ref_fig)
               for n in device_classes}
        inc = None if inc_fig is None else {
            n: _with(make_outcome(n, {"probs": softmax(logits)}, emulated=device_classes[n].emulated), inc_fig)
            for n in device_classes}
        return cand, ref, inc
    return make


def test_ratios_are_candidate_over_other_for_figures_both_have():
    got = ratios(figures(200, 40, 10, 1), figures(100, 20, 5, 4))
    assert got == pytest.approx({"peak_memory_ratio": 2.0, "load_ratio": 2.0, "first_inference_ratio": 2.0,
                                 "artifact_ratio": 0.25})
    assert ratios(figures(), None) == {}
    assert ratios(dataclasses.replace(figures(), load_ms=None), figures(), "_vs_incumbent").keys() == \
        {"peak_memory_ratio_vs_incumbent", "first_inference_ratio_vs_incumbent", "artifact_ratio_vs_incumbent"}
    assert [f.limit_key for f in FIGURES] == ["max_peak_memory_mb", "max_load_ms", "max_first_inference_ms",
                                              "max_artifact_mb", "max_instructions_per_inference"]


def test_limits_are_off_by_default_and_figures_are_reported(runs, device_classes, classifier_data):
    cand, ref, _ = runs(figures(300), figures(100))
    decision = evaluate(cand, ref, device_classes, load_policy(None), classifier_data[1])
    assert decision.verdict == "PROMOTE"
    x86 = decision.metrics["x86"]
    assert x86.device["candidate"].peak_memory_bytes == int(300 * MB) and not x86.device["candidate"].emulated
    assert x86.device_ratios["peak_memory_ratio"] == pytest.approx(3.0)
    assert decision.metrics["arm"].device["candidate"].emulated        # labelled emulated on the QEMU class
    assert not any(c.name.startswith(("peak", "load", "first", "artifact")) for c in decision.checks)


def test_a_1_mb_peak_memory_budget_rejects_with_a_memory_reason(tmp_path, runs, device_classes, classifier_data):
    cand, ref, _ = runs(figures(58.5), figures(60))
    policy = _policy(tmp_path, "[defaults]\nmax_peak_memory_mb = 1\n")
    decision = evaluate(cand, ref, device_classes, policy, classifier_data[1])
    assert decision.verdict == "REJECT"
    failed = [c for c in decision.checks if not c.passed]
    assert [(c.device_class, c.name, c.threshold) for c in failed] == [("x86", "peak_memory_mb", 1.0)]
    reason = decision.reasons[0]
    assert "peak_memory_mb is 58.5" in reason and "<= 1" in reason and "x86-server" in reason
    assert any("emulated" in n and "max_peak_memory_mb" in n for n in decision.notes)   # arm: reported only


def test_each_absolute_limit_and_ratio_is_checked_against_its_figure(tmp_path, runs, device_classes,
                                                                     classifier_data):
    cand, ref, inc = runs(figures(120, 30, 6, 3), figures(100, 20, 5, 4), figures(100, 40, 6, 3))
    policy = _policy(tmp_path, """
[override.x86-server]
max_peak_memory_mb = 128
max_load_ms = 25
max_first_inference_ms = 10
max_artifact_mb = 2.5
max_peak_memory_ratio = 1.1
max_load_ratio_vs_incumbent = 0.8
""")
    decision = evaluate(cand, ref, device_classes, policy, classifier_data[1], inc)
    got = {c.name: (c.passed, round(c.value, 4)) for c in decision.checks if c.device_class == "x86"
           and c.name not in ("run", "reference_run", "finite", "reference_finite", "accuracy_ratio",
                              "noninferior_accuracy", "noninferior_latency")}
    assert got == {"peak_memory_mb": (True, 120.0), "load_ms": (False, 30.0), "first_inference_ms": (True, 6.0),
                   "artifact_mb": (False, 3.0), "peak_memory_ratio": (False, 1.2),
                   "load_ratio_vs_incumbent": (True, 0.75)}
    # the tier override applies to x86-server only: the emulated arm class has no device checks at all
    assert not [c for c in decision.checks if c.device_class == "arm" and "memory" in c.name]


def test_emulated_classes_gate_size_but_not_time_or_memory(tmp_path, runs, device_classes, classifier_data):
    cand, ref, _ = runs(figures(500, 900, 90, 9), figures(100, 20, 5, 4))
    policy = _policy(tmp_path, "[override.cortex-a]\nmax_peak_memory_mb = 1\nmax_load_ms = 1\n"
                               "max_artifact_mb = 8\n")
    decision = evaluate(cand, ref, device_classes, policy, classifier_data[1])
    arm = [c for c in decision.checks if c.device_class == "arm" and c.name.endswith(("_mb", "_ms"))]
    assert [(c.name, c.passed) for c in arm] == [("artifact_mb", False)]
    assert any("arm: device figures are emulated" in n and "max_load_ms" in n for n in decision.notes)


def test_an_oom_run_is_a_memory_finding_and_other_classes_keep_their_results(runs, device_classes,
                                                                             classifier_data, make_outcome):
    cand, ref, _ = runs(figures(), figures())
    killed = make_outcome("x86", None, status="failed",
                          reason="out of memory: killed at the device class's memory limit (64m)")
    cand["x86"] = _with(killed, None, oom_limit_bytes=64 * MB)
    decision = evaluate(cand, ref, device_classes, load_policy(None), classifier_data[1])
    assert decision.verdict == "REJECT"
    oom = [c for c in decision.checks if c.name == "memory_limit"]
    assert len(oom) == 1 and oom[0].device_class == "x86" and oom[0].threshold == 64.0 and not oom[0].passed
    assert "64 MB" in oom[0].detail and "x86-server" in oom[0].detail
    assert "memory_limit is out of memory (candidate)" in " ".join(decision.reasons)
    assert all(c.passed for c in decision.checks if c.device_class == "arm")
    assert decision.metrics["arm"].device["candidate"].peak_memory_bytes == figures().peak_memory_bytes


def test_a_limit_without_figures_fails_as_not_measured(tmp_path, runs, device_classes, classifier_data):
    cand, ref, _ = runs(None, figures())
    policy = _policy(tmp_path, "[override.x86-server]\nmax_load_ratio = 2\n")
    decision = evaluate(cand, ref, device_classes, policy, classifier_data[1])
    assert decision.metrics["x86"].device_ratios == {}
    assert any("no device figures" in n for n in decision.notes)
    (check,) = [c for c in decision.checks if c.name == "load_ratio"]
    assert not check.passed and check.value is None and "not measured" in check.detail
    assert decision.verdict == "REJECT"


def test_device_figures_round_trip_through_the_decision_json(tmp_path, runs, device_classes, classifier_data):
    profile = OpProfile(True, "onnxruntime profiling JSON", "", 20, {"Conv": OpTime(12.5, 60, 3)},
                        [NodeTime("conv1", "Conv", 6.25, "CPUExecutionProvider")])
    cand, ref, inc = runs(figures(profile=profile), figures(), figures(90))
    policy = _policy(tmp_path, "[defaults]\nmax_peak_memory_mb = 512\nmax_peak_memory_ratio_vs_incumbent = 1.5\n")
    decision = evaluate(cand, ref, device_classes, policy, classifier_data[1], inc)
    back = Decision.from_json(json.loads(json.dumps(decision.to_json(), allow_nan=False)))
    assert back == decision
    fig = back.metrics["x86"].device["candidate"]
    assert isinstance(fig, DeviceFigures) and isinstance(fig.op_profile.by_op_type["Conv"], OpTime)
    assert fig.op_profile.nodes[0] == NodeTime("conv1", "Conv", 6.25, "CPUExecutionProvider")
    assert back.metrics["x86"].device_ratios == decision.metrics["x86"].device_ratios


def test_policy_refuses_a_bad_device_limit(tmp_path):
    with pytest.raises(InputError, match="max_peak_memory_mb must not be negative"):
        _policy(tmp_path, "[defaults]\nmax_peak_memory_mb = -1\n")
    with pytest.raises(InputError, match="unknown key 'max_peak_memory'"):
        _policy(tmp_path, "[defaults]\nmax_peak_memory = 1\n")
    assert load_policy(None).defaults.max_peak_memory_mb is None


def test_outputs_are_unaffected_by_device_figures(runs, device_classes, classifier_data):
    cand, ref, _ = runs(figures(), figures())
    decision = evaluate(cand, ref, device_classes, load_policy(None), classifier_data[1])
    assert np.isclose(decision.metrics["x86"].outputs["probs"].cosine, 1.0)


def counted(insns: float, fig: DeviceFigures | None = None) -> DeviceFigures:
    return dataclasses.replace(fig or figures(), instructions_per_inference=insns, instructions_spread=0.001,
                               instructions_calls=16, reads_per_inference=insns / 4, load_instructions=10 * int(insns),
                               instructions_source="qemu-tcg-plugin")


def test_instructions_are_gated_on_emulated_classes_and_noted_natively(tmp_path, runs, device_classes,
                                                                       classifier_data):
    """Counted under QEMU, exact: gated on the emulated class, where time and memory are not; a native class has
    no count, so its limit is a note, not a failure."""
    cand, ref, inc = runs(counted(1.2e8), counted(1.0e8), counted(1.1e8))
    cand["x86"], ref["x86"], inc["x86"] = (_with(o, figures()) for o in (cand["x86"], ref["x86"], inc["x86"]))
    policy = _policy(tmp_path, "[defaults]\nmax_instructions_ratio = 1.05\nmax_instructions_ratio_vs_incumbent = 1.2\n"
                               "max_instructions_per_inference = 2e8\n")
    decision = evaluate(cand, ref, device_classes, policy, classifier_data[1], inc)
    arm = {c.name: (c.passed, round(c.value, 4)) for c in decision.checks
           if c.device_class == "arm" and c.name.startswith("instructions")}
    assert arm == {"instructions_per_inference": (True, 1.2e8), "instructions_ratio": (False, 1.2),
                   "instructions_ratio_vs_incumbent": (True, round(1.2 / 1.1, 4))}
    assert decision.verdict == "REJECT" and "candidate / FP32 reference" in \
        next(c.detail for c in decision.checks if c.name == "instructions_ratio")
    assert not [c for c in decision.checks if c.device_class == "x86" and c.name.startswith("instructions")]
    assert any("x86: instructions are counted on emulated classes only" in n for n in decision.notes)
    assert decision.metrics["arm"].device_ratios["instructions_ratio"] == pytest.approx(1.2)
    back = Decision.from_json(json.loads(json.dumps(decision.to_json(), allow_nan=False)))
    assert back == decision and back.metrics["arm"].device["candidate"].load_instructions == int(1.2e9)


def test_an_emulated_run_without_counts_fails_an_instructions_limit_as_not_measured(tmp_path, runs,
                                                                                    device_classes, classifier_data):
    cand, ref, _ = runs(figures(), figures())        # no counting QEMU on that machine
    decision = evaluate(cand, ref, device_classes, _policy(tmp_path, "[defaults]\nmax_instructions_ratio = 1.05\n"),
                        classifier_data[1])
    (check,) = [c for c in decision.checks if c.name == "instructions_ratio"]
    assert check.device_class == "arm" and not check.passed and "not measured" in check.detail
