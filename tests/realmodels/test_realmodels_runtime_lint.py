"""Lint of the graph each tier runs, on PaddleOCR's text-direction classifier (issue 24): with a no-op Clip
slipped between each Conv and its BatchNormalization (kit.unfused_batchnorm) the outputs are the same,
but every tier's runtime keeps the 35 normalizations as kernels of their own. `inspect --target` must say
so on each tier, naming the nodes; the original model gets no such finding."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tiergate.cli.intake import inspect_report

from .kit import unfused_batchnorm

pytestmark = pytest.mark.realmodels

X86 = "x86_64-cpu-onnxruntime"
ARM = "arm64-cpu-onnxruntime"
BATCHNORMS = 35     # BatchNormalization nodes after a Conv in ch_ppocr_mobile_v2.0_cls_infer.onnx


def _variant(real_model, tmp_path, bound=None):
    source = real_model("paddleocr_cls")
    variant = unfused_batchnorm(source, tmp_path, bound)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 3, 48, 192)).astype(np.float32)
    same = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
            for p in (source, variant)]
    np.testing.assert_allclose(same[0], same[1], rtol=1e-5, atol=1e-6)   # a no-op: the same outputs
    return source, variant


def _unfolded(report, target):
    return [f for f in report["findings"] if f["rule"] == "unfolded-batchnorm" and f["target"] == target]


def _check_tier(report, target, original):
    (finding,) = _unfolded(report, target)
    assert finding["basis"] == "runtime" and finding["severity"] == "warning" and target in finding["message"]
    assert finding["message"].startswith(f"[{target}: onnxruntime level all] {BATCHNORMS} normalization(s)")
    # every pair named: the convolution (with the no-op Clip fused in) and the normalization after it
    assert len(finding["nodes"]) == len(finding["node_names"]) == 2 * BATCHNORMS
    assert "fused Clip whose bounds no value reaches" in finding["message"]
    assert _unfolded(original, target) == []
    return finding


def test_a_clip_to_3_4e38_is_a_no_op_on_the_file_too(real_model, tmp_path):
    """An exporter's Clip to +-3.4e38 (0.08 % inside float32's largest value) clips nothing a network computes: the
    35 normalizations behind it are found on the file as behind FLT_MAX (issue 45)."""
    _, variant = _variant(real_model, tmp_path, 3.4e38)
    report, _ = inspect_report(variant)
    (finding,) = [f for f in report["findings"] if f["rule"] == "unfolded-batchnorm"]
    assert finding["message"].startswith(f"{BATCHNORMS} normalization(s)") and "Clip x35" in finding["message"]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("bound", [None, 3.4e38], ids=["flt_max", "3.4e38"])
def test_unfused_batchnorm_on_the_x86_tier(real_model, realmodels_home, tmp_path, bound):
    source, variant = _variant(real_model, tmp_path, bound)
    report, code = inspect_report(variant, X86)
    original, _ = inspect_report(source, X86)
    finding = _check_tier(report, X86, original)
    # x86's NCHWc runs each kept BatchNormalization as a depthwise 1x1 convolution (onnxruntime names it *_bn_nchwc)
    assert "BatchNormalization as a depthwise 1x1 NCHWc Conv x35" in finding["message"]
    assert sum(name.endswith("_bn_nchwc") for name in finding["node_names"]) == BATCHNORMS
    convs = [r["runtime"][X86]["ops"]["all"]["com.microsoft.nchwc:Conv"] for r in (report, original)]
    assert convs[0] == convs[1] + BATCHNORMS
    assert code == 0    # a warning: the gate still decides on the outputs
    # both convert layouts between NCHWc regions (the decomposed hard-swish has no NCHWc kernel): information,
    # naming every reorder node the tier runs
    ops = original["runtime"][X86]["ops"]["all"]
    (layout,) = [f for f in original["findings"] if f["rule"] == "layout-reorder"]
    assert layout["severity"] == "info" and layout["target"] == X86
    assert len(layout["node_names"]) == ops["com.microsoft.nchwc:ReorderInput"] + ops["com.microsoft.nchwc:ReorderOutput"]


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_unfused_batchnorm_on_the_emulated_arm64_tier(real_model, realmodels_home, tmp_path):
    source, variant = _variant(real_model, tmp_path)
    report, _ = inspect_report(variant, ARM)
    original, _ = inspect_report(source, ARM)
    graph = report["runtime"][ARM]
    assert graph["machine"] == "aarch64" and graph["ops"]["all"][":BatchNormalization"] == BATCHNORMS
    finding = _check_tier(report, ARM, original)
    assert "FusedConv -> BatchNormalization x35" in finding["message"]
    assert sum(name.startswith("batch_norm") or "BatchNormalization" in name
               for name in finding["node_names"]) == BATCHNORMS


def test_a_custom_op_the_installed_litert_resolves_is_no_file_level_error(real_model, capsys):
    """MediaPipe's selfie segmenter ships a custom op (Convolution2DTransposeBias) that LiteRT's XNNPACK delegate
    takes, so both TFLite tiers run it: file-level inspect warns (it loads only where XNNPACK takes it) and exits 0."""
    from tiergate.cli.main import main

    path = real_model("selfie_segmentation")
    report, code = inspect_report(path)
    (finding,) = [f for f in report["findings"] if f["rule"] == "unsupported-op" and "custom op" in f["message"]]
    assert code == 0 and finding["severity"] == "warning" and "Convolution2DTransposeBias" in finding["message"]
    assert "XNNPACK" in finding["message"] and main(["inspect", str(path)]) == 0, capsys.readouterr().err
