"""Models for the pairing tests: FP32 networks, quantized by onnxruntime's own `quantize_static` in every form it
offers (QDQ and QOperator, per-tensor and per-channel weights, with and without `quant_pre_process`), and two
defects made in the middle of each INT8 network, at the tensor `TENSOR[model]`.

The networks (FP32 node and tensor names in brackets):
- `mlp`: x [N,16] -> Gemm [fc1 -> h] -> Relu [relu1 -> r] -> Gemm [fc2 -> logits] (the issue's case: quantize_static
  absorbs the Relu into the quantization of the first Gemm's output; the QDQ Gemm writes `r`, the QOperator QGemm
  `h_quantized`, with the Relu's range).
- `cnn`: x [N,3,12,12] -> Conv [conv1 -> c1] -> Relu [relu1 -> a1] -> Conv [conv2 -> c2] -> BatchNormalization
  [bn2 -> n2] -> Clip(0, 6) [clip2 -> a2] -> Conv [conv3 -> c3] -> Relu [relu3 -> a3] -> GlobalAveragePool [gap -> p]
  -> Flatten [flat -> f] -> MatMul [fc -> m] -> Add [bias -> logits]. quant_pre_process folds bn2 into conv2 and
  MatMul + Add into one Gemm; quantize_static absorbs the Relu and the Clip.

The defects, at TENSOR (`a2` in the cnn, `r` in the mlp), the activation after the layer's fused activation:
- `default_range`: the tensor's quantization given the default range [-6, 6] of an uncalibrated tensor (QDQ: the
  QuantizeLinear/DequantizeLinear pair's scale and zero point; QOperator: the producing QGemm/QLinearConv's output
  scale and zero point, which its consumer reads as its input's: the same initializers). Values beyond 6 clip.
- `qdq_removed` (QDQ): the tensor's QuantizeLinear/DequantizeLinear pair removed; its consumer reads the float
  tensor, and the Relu/Clip that was absorbed into that quantization is lost with it.
- `qdq_removed` (QOperator, the same defect in that form): QOperator has no Q/DQ pair at the tensor: the two
  integer layers around it compute and hand over the tensor in integers. Removing its requantization means
  making both run in float, as QDQ would after the removal: the producer becomes DequantizeLinear -> float op
  (its own weights, dequantized) and the consumer float op -> QuantizeLinear of the consumer's output (its own
  output scale), both reading and writing the float tensor in between. The absorbed Relu/Clip is lost, as in QDQ.
  The float nodes are named after the quantized ones (`fc1_quant_float`) and their tensors are new names
  (`fc1_quant_out_float`): only the structure pairs them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FEATURES, HIDDEN, CLASSES = 16, 24, 6
TENSOR = {"mlp": "r", "cnn": "a2"}


def _finish(nodes, name, x_shape, y_shape, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def mlp(seed: int = 0) -> onnx.ModelProto:
    """Gemm, Relu, Gemm; r reaches about 20 on inputs in [-1, 1], beyond a default [-6, 6] range."""
    rng = np.random.default_rng(seed)
    inits = {"W1": (rng.standard_normal((HIDDEN, FEATURES)) * 4 / np.sqrt(FEATURES)).astype(np.float32),
             "b1": np.full(HIDDEN, 0.5, np.float32),
             "W2": (rng.standard_normal((CLASSES, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32),
             "b2": np.zeros(CLASSES, np.float32)}
    node = helper.make_node
    nodes = [node("Gemm", ["x", "W1", "b1"], ["h"], name="fc1", transB=1),
             node("Relu", ["h"], ["r"], name="relu1"),
             node("Gemm", ["r", "W2", "b2"], ["logits"], name="fc2", transB=1)]
    return _finish(nodes, "pairing_mlp", ["N", FEATURES], ["N", CLASSES], inits)


def cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv-Clip(0,6), Conv-Relu, Conv-BN-Relu, pool, MatMul+Add; a2 (the middle Relu's output) reaches well beyond
    6 on inputs in [-1, 1], so a default [-6, 6] range clips it."""
    rng = np.random.default_rng(seed)
    c = 8

    def w(*shape, gain=1.0):
        return (rng.standard_normal(shape) * gain / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = {"w1": w(c, 3, 3, 3, gain=3.0), "b1": np.full(c, 0.1, np.float32),
             "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32),
             "w2": w(c, c, 3, 3, gain=3.0), "b2": np.full(c, 0.5, np.float32),
             "w3": w(c, c, 1, 1, gain=1.0), "b3": np.zeros(c, np.float32),
             "bn_s": np.linspace(0.5, 1.5, c).astype(np.float32), "bn_b": np.linspace(-0.5, 1.0, c).astype(np.float32),
             "bn_m": np.full(c, 0.1, np.float32), "bn_v": np.full(c, 2.0, np.float32),
             "W": (rng.standard_normal((c, CLASSES)) / np.sqrt(c)).astype(np.float32),
             "B": np.zeros(CLASSES, np.float32)}
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             node("Clip", ["c1", "lo", "hi"], ["a1"], name="clip1"),
             node("Conv", ["a1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             node("Relu", ["c2"], ["a2"], name="relu2"),
             node("Conv", ["a2", "w3", "b3"], ["c3"], name="conv3"),
             node("BatchNormalization", ["c3", "bn_s", "bn_b", "bn_m", "bn_v"], ["n3"], name="bn3"),
             node("Relu", ["n3"], ["a3"], name="relu3"),
             node("GlobalAveragePool", ["a3"], ["p"], name="gap"),
             node("Flatten", ["p"], ["f"], name="flat"),
             node("MatMul", ["f", "W"], ["m"], name="fc"),
             node("Add", ["m", "B"], ["logits"], name="bias")]
    return _finish(nodes, "pairing_cnn", ["N", 3, 12, 12], ["N", CLASSES], inits)


BUILDERS = {"mlp": mlp, "cnn": cnn}


def inputs(model: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (n, FEATURES) if model == "mlp" else (n, 3, 12, 12)
    return rng.uniform(-1, 1, shape).astype(np.float32)


class _Reader:
    def __init__(self, x: np.ndarray):
        self.batches = iter([{"x": x[i:i + 4]} for i in range(0, len(x), 4)])

    def get_next(self):
        return next(self.batches, None)


def quantize(fp32: Path, out: Path, calibration: np.ndarray, *, fmt: str, per_channel: bool, prep: bool) -> Path:
    """onnxruntime's quantize_static (uint8 activations, int8 weights), optionally after quant_pre_process."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source = fp32
    if prep:
        source = out.with_name(out.stem + "-prep.onnx")
        quant_pre_process(str(fp32), str(source), skip_symbolic_shape=True)
    quantize_static(str(source), str(out), _Reader(calibration), quant_format=getattr(QuantFormat, fmt),
                    per_channel=per_channel, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out
