"""The shared model factory (tests/modelkit.py): each builder makes a valid model that computes what it says.

Every expected value is written out here with numpy, independent of the builder.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import modelkit as mk
from tiergate.artifact import load_artifact


def _run(path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


def _weights(path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def test_mlp_is_relu_of_an_affine_map(tmp_path):
    path = mk.write(mk.mlp(seed=5), tmp_path / "mlp.onnx")
    w = _weights(path)
    x = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    (y,) = _run(path, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x @ w["W"] + w["B"], 0), rtol=1e-5, atol=1e-6)
    assert y.min() == 0 and y.max() > 0                     # the Relu is exercised on both sides
    assert mk.mlp(seed=5) == mk.mlp(seed=5) and mk.mlp(seed=5) != mk.mlp(seed=6)


def test_classifier_outputs_probabilities_of_n_classes(tmp_path):
    path = mk.write(mk.classifier(n_classes=5, n_features=6, seed=1), tmp_path / "c.onnx")
    w = _weights(path)
    x = np.random.default_rng(1).standard_normal((10, 6)).astype(np.float32)
    (y,) = _run(path, {"x": x})
    logits = x.astype(np.float64) @ w["W"] + w["b"]
    expected = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(y, expected / expected.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert y.shape == (10, 5)


def test_linear_takes_the_given_weights_and_names(tmp_path):
    weights = np.arange(6, dtype=np.float32).reshape(3, 2)
    path = mk.write(mk.linear(weights, input_name="features", output_name="scores"), tmp_path / "l.onnx")
    (y,) = _run(path, {"features": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(y, np.ones((2, 3), np.float32) @ weights)
    assert [n.op_type for n in onnx.load(str(path)).graph.node] == ["MatMul"]


def test_multi_input_feeds_two_element_types(tmp_path):
    path = mk.write(mk.multi_input(seed=2), tmp_path / "multi.onnx")
    artifact = load_artifact(path)
    assert [(s.name, s.dtype) for s in artifact.inputs] == [("image", "float32"), ("mask", "int64")]
    rng = np.random.default_rng(3)
    image = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    mask = rng.integers(0, 2, (4, 4)).astype(np.int64)
    (y,) = _run(path, {"image": image, "mask": mask})
    np.testing.assert_allclose(y, (image.mean(axis=(2, 3)) @ _weights(path)["W"]) * mask, rtol=1e-5, atol=1e-6)


def test_if_subgraph_takes_the_branch_the_data_selects(tmp_path):
    model = mk.if_subgraph()
    (node,) = [n for n in model.graph.node if n.op_type == "If"]
    assert {a.name for a in node.attribute} == {"then_branch", "else_branch"}
    path = mk.write(model, tmp_path / "if.onnx")
    positive = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    negative = -positive
    np.testing.assert_array_equal(_run(path, {"x": positive})[0], np.maximum(positive, 0))
    np.testing.assert_array_equal(_run(path, {"x": negative})[0], -negative)


def test_qdq_quantization_adds_quantize_pairs_and_stays_close(tmp_path):
    x = np.random.default_rng(4).standard_normal((64, 4)).astype(np.float32)
    fp32 = mk.write(mk.classifier(seed=7), tmp_path / "fp32.onnx")
    int8 = mk.quantize_qdq(fp32, tmp_path / "int8.onnx", {"x": x[:32]})
    ops = [n.op_type for n in onnx.load(str(int8)).graph.node]
    assert ops.count("QuantizeLinear") >= 1 and ops.count("DequantizeLinear") >= 2
    seen = x[:32]                       # inside the calibrated ranges, the 8-bit steps bound the error
    # the Q/DQ arithmetic as written (no fusion into integer kernels): x86 CPUs without VNNI saturate u8s8
    # products in their fused kernels (docs/cpu.md), which is the CPU's error, not the quantization's
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    unfused = ort.InferenceSession(str(int8), options, providers=["CPUExecutionProvider"]).run(None, {"x": seen})
    np.testing.assert_allclose(unfused[0], _run(fp32, {"x": seen})[0], atol=0.05)
    dynamic = mk.quantize_dynamic_int8(fp32, tmp_path / "dyn.onnx")
    assert any(t.data_type == onnx.TensorProto.INT8 for t in onnx.load(str(dynamic)).graph.initializer)


def test_external_data_lands_beside_the_model(tmp_path):
    path = mk.write(mk.classifier(seed=1), tmp_path / "m" / "model.onnx", external="weights/w.bin")
    assert (tmp_path / "m" / "weights" / "w.bin").stat().st_size > 0
    assert load_artifact(path).format == "onnx"


@pytest.mark.slow
@pytest.mark.tflite_extra
def test_tflite_mlp_pair_is_float_and_full_int8(tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    pair = mk.tflite_mlp_pair(tmp_path, features=8, outputs=4)
    dtypes = {}
    for kind, path in pair.items():
        interp = Interpreter(model_path=str(path))
        dtypes[kind] = (interp.get_input_details()[0]["dtype"], interp.get_output_details()[0]["dtype"])
    assert dtypes == {"fp32": (np.float32, np.float32), "int8": (np.int8, np.int8)}
