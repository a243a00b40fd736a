"""Real models fed as their users feed them (issue 13): silero VAD through a data loader (state on axis 1, `sr` a
constant) on both CPU tiers, its no-`sr` variant's signature finding, and PaddleOCR's text-direction classifier
quantized to INT8 by onnxruntime's own quantizer on correctly pre-processed text lines."""

from __future__ import annotations

import numpy as np
import pytest

import gatekit
from tiergate import orchestrator
from tiergate.gate import REJECT
from tiergate.policy import load_policy
from tiergate.targets import resolve

from .kit import int8_calibrated, text_lines

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.slow]

X86 = "x86_64-cpu-onnxruntime"
ARM = "arm64-cpu-onnxruntime"

SILERO_LOADER = '''
import numpy as np

def chunks():
    """24 chunks of 512 samples at 16 kHz: silence, noise and a voiced tone; a fresh state for each call."""
    rng = np.random.default_rng(0)
    t = np.arange(512) / 16000
    for i in range(24):
        kind = i % 3
        audio = (np.zeros(512) if kind == 0 else rng.normal(0, 0.05, 512) if kind == 1
                 else 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)))
        yield {"input": audio[None].astype(np.float32), "state": np.zeros((2, 1, 128), np.float32),
               "sr": np.array(16000, np.int64)}
'''


@pytest.mark.emulated
def test_silero_vad_through_a_loader_passes_against_itself_on_both_tiers(real_model, realmodels_home, tmp_path):
    loader = tmp_path / "vad_chunks.py"
    loader.write_text(SILERO_LOADER)
    model = real_model("silero_vad")
    run = gatekit.gate(model, model, f"{loader}:chunks", resolve([X86, ARM]), load_policy())
    decision = run.decision
    assert decision.verdict == "PROMOTE", decision.reasons
    for dc in (X86, ARM):
        outputs = decision.metrics[dc].outputs
        assert outputs["output"].n_samples == 24 and outputs["stateN"].n_samples == 24
        assert outputs["output"].max_abs_error == 0.0               # the same model on the same tier: identical
    saved = orchestrator.load_outcomes(run.run_dirs)["candidate"]
    assert saved[X86].outputs["stateN"].shape == (24, 2, 128)      # batch axis 1 moved first, per sample
    assert saved[X86].result.extra["output_sample_axes"] == {"output": 0, "stateN": 1}
    # x86 vs emulated arm64 of the same model: close, not bit-identical
    drift = decision.drift["candidate"].pairs[(X86, ARM)]["output"]
    assert drift.max_abs_error < 1e-3


def test_silero_vad_without_sr_is_a_signature_finding(real_model, realmodels_home, tmp_path):
    import onnx
    from onnx import helper

    model = onnx.load(real_model("silero_vad"))
    (sr,) = [i for i in model.graph.input if i.name == "sr"]
    model.graph.input.remove(sr)
    model.graph.node.insert(0, helper.make_node("Constant", [], ["sr"], value=helper.make_tensor(
        "sr_value", onnx.TensorProto.INT64, [], [16000])))
    variant = tmp_path / "silero_vad_no_sr.onnx"
    onnx.save(model, variant)
    loader = tmp_path / "vad_chunks.py"
    loader.write_text(SILERO_LOADER)
    run = gatekit.gate(variant, real_model("silero_vad"), f"{loader}:chunks", resolve([X86]), load_policy())
    assert run.decision.verdict == REJECT and run.containers_started == 0 and not run.run_dirs
    assert [c.name for c in run.decision.checks] == ["signature"]
    assert "input 'sr' int64[] of the reference is missing" in run.decision.reasons[0]


# --- PaddleOCR text direction: 0 upright, 1 rotated 180 degrees ------------------------------------------

# text_lines (rendered, pre-processed lines) and int8_calibrated (the INT8 candidate) live in kit.py, shared
# with bench/bench_gate_paddleocr.py.


def test_paddleocr_int8_with_fp32_accuracy_is_not_rejected(real_model, realmodels_home, tmp_path):
    source = real_model("paddleocr_cls")
    x, labels = text_lines(400, seed=1)
    int8 = int8_calibrated(source, tmp_path, text_lines(64, seed=2)[0])
    data = tmp_path / "lines.npz"
    np.savez(data, x=x, labels=labels)
    run = gatekit.gate(int8, source, data, resolve([X86]), load_policy())
    decision = run.decision
    m = decision.metrics[X86]
    top1 = m.task["top1_accuracy"]
    print(f"PaddleOCR cls INT8 vs FP32 on {X86}: {decision.verdict}; accuracy {top1.candidate:.4f} vs "
          f"{top1.reference:.4f}, ratio {top1.ratio.estimate:.4f} [{top1.ratio.low:.4f}, {top1.ratio.high:.4f}], "
          f"needs {top1.samples_needed}; cosine {m.outputs[top1.output].cosine:.4f}, "
          f"SQNR {m.outputs[top1.output].sqnr_db:.1f} dB; warnings {decision.warnings}")
    assert top1.reference > 0.7                                     # correctly pre-processed: FP32 reads them
    if top1.candidate >= top1.reference:                            # INT8 as accurate as FP32: never rejected
        assert decision.verdict != REJECT, decision.reasons
    assert not any(c.name in ("cosine", "sqnr_db") for c in decision.checks)    # agreement is evidence here
    assert decision.verdict == REJECT or top1.ratio.low < 0.99 <= top1.ratio.high or top1.ratio.low >= 0.99
