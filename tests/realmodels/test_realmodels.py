"""Real public models no one here wrote (issue 12): no false errors, subgraphs read, tiers'
runtime graphs that really differ, and float islands only the runtime graph shows."""

from __future__ import annotations

import numpy as np
import pytest

from tiergate.artifact import load_artifact
from tiergate.cli.intake import inspect_report
from tiergate.lint import lint

pytestmark = pytest.mark.realmodels

X86 = "x86_64-cpu-onnxruntime"
ARM = "arm64-cpu-onnxruntime"


@pytest.mark.parametrize("key", ["paddleocr_cls", "silero_vad"])
def test_no_error_finding_at_file_level(real_model, key):
    artifact = load_artifact(real_model(key))
    assert artifact.op_counts.get("Constant", 0) > 40  # the folded-at-load ops that were false errors
    errors = [f for f in lint(artifact) if f.severity == "error"]
    assert errors == []


def test_silero_network_is_read_inside_its_if_branches(real_model):
    artifact = load_artifact(real_model("silero_vad"))
    top = [n for n in artifact.nodes if not n.scope]
    convs = [n for n in artifact.nodes if n.op == "Conv"]
    assert len(top) < 10 and "If" in {n.op for n in top}
    assert convs and all(n.scope and "_branch/" in n.path for n in convs)
    assert any("/then_branch/" in n.path for n in convs) and any("/else_branch/" in n.path for n in convs)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("key", ["paddleocr_cls", "silero_vad"])
def test_no_error_finding_on_the_x86_tier(real_model, realmodels_home, key):
    report, code = inspect_report(real_model(key), X86)
    graph = report["runtime"][X86]
    assert graph["ok"] and graph["machine"] == "x86_64"
    assert code == 0 and report["summary"]["error"] == 0
    # BatchNormalization is folded into Conv at the basic level: no unfolded-batchnorm on the tier
    assert not [f for f in report["findings"] if f["rule"] == "unfolded-batchnorm"]


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_fusedconv_counts_differ_between_x86_and_emulated_arm64(real_model, realmodels_home):
    report, code = inspect_report(real_model("paddleocr_cls"), f"{X86},{ARM}")
    x86, arm = report["runtime"][X86], report["runtime"][ARM]
    assert code == 0 and (x86["machine"], arm["machine"]) == ("x86_64", "aarch64") and arm["emulated"]
    fused = {name: g["ops"]["all"].get("com.microsoft:FusedConv", 0) for name, g in report["runtime"].items()}
    assert fused[X86] != fused[ARM] and fused[ARM] > 0
    # x86_64 turns the rest into NCHWc convolutions; both agree up to the extended level
    assert x86["ops"]["all"].get("com.microsoft.nchwc:Conv", 0) > 0 and "com.microsoft.nchwc:Conv" not in arm["ops"]["all"]
    assert x86["fingerprints"]["extended"]["structure"] == arm["fingerprints"]["extended"]["structure"]
    assert x86["fingerprints"]["all"]["structure"] != arm["fingerprints"]["all"]["structure"]


def _int8_without_preprocessing(source, folder):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Random(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.batches = iter([{"x": rng.uniform(-1, 1, (2, 3, 48, 192)).astype(np.float32)} for _ in range(3)])

        def get_next(self):
            return next(self.batches, None)

    out = folder / "paddleocr_cls_int8.onnx"
    quantize_static(str(source), str(out), Random(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


@pytest.mark.docker
@pytest.mark.slow
def test_batchnorm_float_islands_in_int8_made_without_preprocessing(real_model, realmodels_home, tmp_path):
    int8 = _int8_without_preprocessing(real_model("paddleocr_cls"), tmp_path)
    report, _ = inspect_report(int8, X86)
    graph = report["runtime"][X86]
    kept = graph["ops"][graph["default_level"]].get(":BatchNormalization", 0)
    assert kept > 0  # onnxruntime keeps them in float: nothing folded them before quantization
    islands = [f for f in report["findings"] if f["rule"] == "float-island" and f["basis"] == "runtime"]
    assert all(f["target"] == X86 and X86 in f["message"] for f in islands)
    # every BatchNormalization kept in float sits between quantized nodes: one island each
    assert len([f for f in islands if "(BatchNormalization)" in f["message"]]) == kept


@pytest.mark.docker
@pytest.mark.slow
def test_mediapipe_custom_op_on_the_x86_litert_tier(real_model, realmodels_home):
    """Convolution2DTransposeBias has no kernel in stock LiteRT: on the file a warning (the installed LiteRT
    loads it only where its XNNPACK delegate takes that node: issue 45, never a file-level error); on the
    tier, LiteRT 2.3.0 loads the model only because its XNNPACK delegate takes that node (measured),
    which the finding says in the runtime's own words."""
    path = real_model("selfie_segmentation")
    found = lint(load_artifact(path))
    assert not [f for f in found if f.severity == "error"]
    (file_level,) = [f for f in found if f.rule == "unsupported-op"]
    assert file_level.severity == "warning" and "Convolution2DTransposeBias" in file_level.message
    report, _ = inspect_report(path, "x86_64-cpu-tflite")
    graph = report["runtime"]["x86_64-cpu-tflite"]
    assert graph["ok"] and graph["ops"]["Convolution2DTransposeBias"] == 1
    assert any("unresolved custom op: Convolution2DTransposeBias" in m for m in graph["needs_delegate"])
    (custom,) = [f for f in report["findings"] if f["rule"] == "unsupported-op"]
    assert custom["basis"] == "runtime" and "without the delegate" in custom["message"]
