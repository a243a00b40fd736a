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
    """onnxruntime's quantize_static (uint8 activations, int8 weights within 7 bits), optionally after
    quant_pre_process. reduce_range, as onnxruntime advises for x86 without VNNI: there the u8s8 kernels add pairs of
    products in int16 and saturate with 8-bit weights (docs/cpu.md), a real loss on such a tier that would come
    before the defect; these tests want the defect to be the first loss on every CPU."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source = fp32
    if prep:
        source = out.with_name(out.stem + "-prep.onnx")
        quant_pre_process(str(fp32), str(source), skip_symbolic_shape=True)
    quantize_static(str(source), str(out), _Reader(calibration), quant_format=getattr(QuantFormat, fmt),
                    per_channel=per_channel, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    reduce_range=True)
    return out


LAYERS = {"mlp": ("fc1", "fc2"), "cnn": ("conv2", "conv3")}   # the FP32 layers before and after TENSOR


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _set_default_range(graph, scale_name: str, zp_name: str, lo: float = -6.0, hi: float = 6.0) -> None:
    inits = {t.name: t for t in graph.initializer}
    zp = numpy_helper.to_array(inits[zp_name])
    info = np.iinfo(zp.dtype)
    scale = (hi - lo) / (int(info.max) - int(info.min))
    inits[scale_name].CopyFrom(numpy_helper.from_array(np.array(scale, np.float32), scale_name))
    inits[zp_name].CopyFrom(numpy_helper.from_array(np.array(round(info.min - lo / scale), zp.dtype), zp_name))


def default_range(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """TENSOR's quantization given the default range [-6, 6]: QDQ, its QuantizeLinear's scale and zero point
    (shared with its DequantizeLinear); QOperator, the output scale and zero point of the layer that writes it,
    which the next layer reads as its input's (the same initializers)."""
    out = _copy(model)
    q = next((n for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == TENSOR[name]), None)
    if q is not None:
        _set_default_range(out.graph, q.input[1], q.input[2])
        return out
    after = next(n for n in out.graph.node if n.name == f"{LAYERS[name][1]}_quant")
    _set_default_range(out.graph, after.input[1], after.input[2])
    return out


def qdq_removed(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """QDQ: TENSOR's Q/DQ pair removed (its reader reads the float tensor; the absorbed Relu is lost). QOperator:
    the two layers around TENSOR made float (module docstring)."""
    tensor = TENSOR[name]
    out = _copy(model)
    graph = out.graph
    q = next((n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor), None)
    if q is not None:
        dq = next(n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
        for node in graph.node:
            node.input[:] = [tensor if i == dq.output[0] else i for i in node.input]
        graph.node.remove(q)
        graph.node.remove(dq)
        return _pruned(out)
    before, after = (next(n for n in graph.node if n.name == f"{layer}_quant") for layer in LAYERS[name])
    readers = [n for n in graph.node if before.output[0] in n.input]
    assert readers == [after], "the layer after TENSOR is its only reader"
    middle = f"{before.name}_out_float"
    x_float = f"{before.name}_in_float"
    first = [helper.make_node("DequantizeLinear", list(before.input[:3]), [x_float], name=f"{before.name}_dq"),
             _float_op(graph, before, x_float, middle)]
    second = [_float_op(graph, after, middle, f"{after.name}_out_float"),
              helper.make_node("QuantizeLinear", [f"{after.name}_out_float", *_out_qparams(after)],
                               [after.output[0]], name=f"{after.name}_q")]
    nodes = []
    for node in graph.node:
        nodes += first if node is before else second if node is after else [node]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(out)
    return _pruned(out)


def _pruned(model: onnx.ModelProto) -> onnx.ModelProto:
    """Without the initializers no node reads any more."""
    used = {i for n in model.graph.node for i in n.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def _out_qparams(node) -> list[str]:
    return list(node.input[6:8]) if node.op_type == "QLinearConv" else list(node.input[7:9])


def _float_op(graph, node, x: str, out: str):
    """A QLinearConv or QGemm as its float op on float `x`, with its own weights and bias dequantized."""
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    x_scale = float(inits[node.input[1]])
    w_q, w_scale, w_zp = (inits[node.input[k]] for k in (3, 4, 5))
    bias_name = node.input[8] if node.op_type == "QLinearConv" else node.input[6]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axis = 0 if node.op_type == "QLinearConv" or attrs.get("transB", 0) else 1
    shape = [1] * w_q.ndim
    shape[axis] = -1
    w = ((w_q.astype(np.float32) - w_zp.astype(np.float32).reshape(shape if w_zp.size > 1 else ()))
         * w_scale.astype(np.float32).reshape(shape if w_scale.size > 1 else ()))
    b = inits[bias_name].astype(np.float32) * x_scale * w_scale.astype(np.float32).reshape(-1)
    w_name, b_name = f"{node.name}_w_float", f"{node.name}_b_float"
    graph.initializer.extend([numpy_helper.from_array(w.astype(np.float32), w_name),
                              numpy_helper.from_array(b.astype(np.float32), b_name)])
    op = "Conv" if node.op_type == "QLinearConv" else "Gemm"
    if op == "Gemm":
        attrs = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
    return helper.make_node(op, [x, w_name, b_name], [out], name=f"{node.name}_float", **attrs)


def variants() -> list[tuple[str, str, bool, bool]]:
    """(model, format, per_channel, pre_processed): every form quantize_static makes."""
    return [(m, f, pc, prep) for m in ("mlp", "cnn") for f in ("QDQ", "QOperator") for pc in (False, True)
            for prep in (False, True)]


def variant_id(variant) -> str:
    model, fmt, per_channel, prep = variant
    return f"{model}-{fmt}-{'per_channel' if per_channel else 'per_tensor'}{'-prep' if prep else ''}"


def write_variant(folder: Path, variant) -> dict[str, Path]:
    """fp32, int8 and the two defects of one variant, and its evaluation data (labels: the FP32 argmax)."""
    import onnxruntime as ort

    model, fmt, per_channel, prep = variant
    folder = Path(folder) / variant_id(variant)
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / "fp32.onnx"
    onnx.save(BUILDERS[model](), fp32)
    int8 = quantize(fp32, folder / "int8.onnx", inputs(model, 32, seed=1), fmt=fmt, per_channel=per_channel,
                    prep=prep)
    paths = {"fp32": fp32, "int8": int8}
    for defect in (default_range, qdq_removed):
        paths[defect.__name__] = folder / f"{defect.__name__}.onnx"
        onnx.save(defect(onnx.load(int8), model), paths[defect.__name__])
    x = inputs(model, 16, seed=2)
    y = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.savez(folder / "eval.npz", x=x, labels=y.argmax(1).astype(np.int64))
    paths["eval"] = folder / "eval.npz"
    return paths
