"""The ONNX export and quantization, on tiny random weights (no TensorFlow needed)."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from demo.host import measure, run_onnx
from demo.reference_cnn import forward, random_images, tiny_weights
from tiergate.demo import onnx_export


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "fp32.onnx"
    return onnx_export.write_fp32(tiny_weights(), path, seed=0)


def test_fp32_graph_has_the_contract_names_and_dynamic_batch(fp32):
    model = onnx.load(str(fp32))
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == "image" and out.name == "probs"
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert dims == ["batch", 8, 8, 1]
    assert [n.op_type for n in model.graph.node] == [
        "Transpose", "Conv", "Relu", "MaxPool", "Flatten", "Gemm", "Relu", "Gemm", "Softmax"]
    assert model.opset_import[0].version == onnx_export.OPSET


def test_fp32_graph_computes_the_keras_architecture(fp32):
    """onnxruntime on the exported graph == numpy NHWC forward pass on the Keras-layout weights."""
    x = random_images(64)
    np.testing.assert_allclose(run_onnx(fp32, x), forward(tiny_weights(), x), atol=1e-5)


def _input_scale(path) -> float:
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    (q,) = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "image_nchw"]
    return float(inits[q.input[1]])


def test_quantized_models_are_qdq_int8_per_channel(fp32, tmp_path):
    calib = random_images(64, seed=2)
    good = onnx_export.quantize_int8(fp32, tmp_path / "good.onnx", calib, "Entropy")
    model = onnx.load(str(good))
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops and "QLinearConv" not in ops
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weight = [a for a in inits.values() if a.dtype == np.int8 and a.ndim == 4]
    assert len(weight) == 1 and weight[0].shape == (4, 1, 3, 3)
    assert np.abs(weight[0]).max() <= 64          # reduce_range: 7-bit weights
    ref = run_onnx(fp32, calib)
    assert measure(ref, run_onnx(good, calib), ref.argmax(1)).cosine > 0.99


def test_wildly_scaled_calibration_widens_the_ranges(fp32, tmp_path):
    calib = random_images(64, seed=2)
    good = onnx_export.quantize_int8(fp32, tmp_path / "good.onnx", calib, "MinMax")
    bad = onnx_export.quantize_int8(fp32, tmp_path / "bad.onnx", calib * 255, "MinMax")
    assert _input_scale(bad) / _input_scale(good) == pytest.approx(255, rel=0.02)
    x = random_images(256, seed=3)
    ref = run_onnx(fp32, x)
    assert measure(ref, run_onnx(bad, x), ref.argmax(1)).sqnr_db < measure(ref, run_onnx(good, x), ref.argmax(1)).sqnr_db - 10
