"""End to end on a real model: an FP32 and a QDQ INT8 digits classifier run with onnxruntime.

The runs are saved as result folders, read back and gated, as the execution layer
and the gate would on two machines.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio

from tiergate import results
from tiergate.artifact.model import TensorSpec
from tiergate.evaldata import load_eval_data, validate_against
from tiergate.gate import PROMOTE, REJECT, RunOutcome, evaluate
from tiergate.policy import load_policy
from tiergate.reports.junit import write_junit
from tiergate.reports.markdown import render_markdown


@pytest.fixture
def saved_runs(digits_models, onnx_runner, tmp_path):
    data_path = tmp_path / "digits.npz"
    np.savez(data_path, x=digits_models["x"], labels=digits_models["labels"])
    data = load_eval_data(data_path)
    validate_against(data, [TensorSpec("x", ("N", 64), "float32")])
    folders = {}
    for side in ("fp32", "int8"):
        outputs, latencies = onnx_runner(digits_models[side], data.arrays["x"])
        result = results.TargetResult(device_class="x86", status="ok", tier="x86-server", machine="x86_64",
                                      latencies_ns=latencies, n_samples=data.n_samples, data_sha256=data.sha256)
        folders[side] = results.save(result, tmp_path / side, {"probs": outputs})
    return folders, data


def test_int8_digits_classifier_is_gated_from_saved_results(saved_runs, device_classes, tmp_path):
    folders, data = saved_runs
    reference, candidate = RunOutcome.load(folders["fp32"]), RunOutcome.load(folders["int8"])
    decision = evaluate({"x86": candidate}, {"x86": reference}, device_classes, load_policy(), data.labels,
                        quantized=True)
    sqnr = decision.metrics["x86"].outputs["probs"]          # with labels, agreement is evidence: no check
    assert not any(c.name in ("sqnr_db", "cosine") for c in decision.checks)
    assert sqnr.sqnr_db == pytest.approx(
        compute_signal_to_quantization_noice_ratio(reference.outputs["probs"], candidate.outputs["probs"]), rel=1e-6)
    acc = decision.metrics["x86"].accuracy
    assert acc["reference"].value > 0.85 and acc["candidate"].value > 0.85
    # measured: cosine about 0.998, SQNR about 25 dB, accuracy unchanged: a good INT8 model passes
    assert decision.verdict == PROMOTE, decision.reasons
    assert decision.metrics["x86"].cost_per_1k["candidate"] > 0
    root = ET.parse(write_junit(decision, tmp_path / "junit.xml")).getroot()
    assert int(root.get("tests")) == len(decision.checks)
    assert render_markdown(decision).startswith("## tiergate gate: ✅ PROMOTE")


def test_a_corrupted_run_is_rejected(saved_runs, device_classes):
    folders, data = saved_runs
    reference = RunOutcome.load(folders["fp32"])
    broken = RunOutcome.load(folders["int8"])
    broken.outputs["probs"][::7] = np.nan                      # a kernel that produces NaN on some inputs
    decision = evaluate({"x86": broken}, {"x86": reference}, device_classes, load_policy(), data.labels,
                        quantized=True)
    assert decision.verdict == REJECT
    failed = {c.label for c in decision.checks if not c.passed and not c.inconclusive}
    assert {"finite[probs]", "accuracy_ratio[probs]"} <= failed
    # output agreement is evidence when labels decide: reported as warnings, not checks
    assert any("cosine[probs]" in w for w in decision.warnings) and any("sqnr_db[probs]" in w for w in decision.warnings)
