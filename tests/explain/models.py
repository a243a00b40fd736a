"""The explain tests' models, built on the shared factory (tests/modelkit.py): a digits-sized MLP
(MatMul -> Add -> Relu -> MatMul -> Add), its INT8 QDQ twin (quantize_static absorbs the Relu into
the output QuantizeLinear of `add1`: the INT8 graph names that tensor `r`), and two defects of it:
one activation given the default [-6, 6] range, and the Q/DQ pair of `r` removed (which removes
the absorbed Relu too)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import modelkit

FEATURES, HIDDEN, CLASSES = 16, 24, 6
TENSOR = "r"                  # the Relu's output: the tensor both defects hit


def fp32_mlp(seed: int = 0, gain: float = 4.0) -> onnx.ModelProto:
    """x [N,16] -> fc1 (MatMul) -> add1 -> relu1 -> r -> fc2 (MatMul) -> add2 -> y [N,6];
    r reaches about 20 on data in [-1, 1] (gain), beyond a default [-6, 6] range."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((FEATURES, HIDDEN)) * gain / np.sqrt(FEATURES)).astype(np.float32)
    w2 = (rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32)
    node = helper.make_node
    graph = helper.make_graph(
        [node("MatMul", ["x", "W1"], ["h0"], name="fc1"), node("Add", ["h0", "b1"], ["h"], name="add1"),
         node("Relu", ["h"], [TENSOR], name="relu1"), node("MatMul", [TENSOR, "W2"], ["y0"], name="fc2"),
         node("Add", ["y0", "b2"], ["y"], name="add2")],
        "explain_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CLASSES])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"),
         numpy_helper.from_array(np.full(HIDDEN, 0.5, np.float32), "b1"),
         numpy_helper.from_array(np.zeros(CLASSES, np.float32), "b2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", modelkit.OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def inputs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (n, FEATURES)).astype(np.float32)


def write_set(folder: Path, n_eval: int = 96) -> dict[str, Path]:
    """fp32, int8 (well calibrated), eval data (labels = the FP32 model's argmax) and calibration data."""
    import onnxruntime as ort

    folder.mkdir(parents=True, exist_ok=True)
    fp32 = modelkit.write(fp32_mlp(), folder / "fp32.onnx")
    cal = {"x": inputs(64, seed=1)}
    np.savez(folder / "cal.npz", **cal)
    int8 = modelkit.quantize_qdq(fp32, folder / "int8.onnx", cal)
    x = inputs(n_eval, seed=2)
    y = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.savez(folder / "eval.npz", x=x, labels=y.argmax(1).astype(np.int64))
    return {"fp32": fp32, "int8": int8, "eval": folder / "eval.npz", "cal": folder / "cal.npz"}


def with_tensor_range(model: onnx.ModelProto, tensor: str, lo: float = -6.0, hi: float = 6.0) -> onnx.ModelProto:
    """One activation's Q/DQ given the range [lo, hi] instead of its calibrated one (uint8)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    q = next(n for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    inits = {t.name: t for t in out.graph.initializer}
    scale = (hi - lo) / 255.0
    inits[q.input[1]].CopyFrom(numpy_helper.from_array(np.array(scale, np.float32), q.input[1]))
    inits[q.input[2]].CopyFrom(numpy_helper.from_array(np.array(round(-lo / scale), np.uint8), q.input[2]))
    return out


def without_qdq(model: onnx.ModelProto, tensor: str) -> onnx.ModelProto:
    """The Q/DQ pair on `tensor` removed, its consumers reading the float tensor again."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    q = next(n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    dq = next(n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
    for node in graph.node:
        node.input[:] = [tensor if name == dq.output[0] else name for name in node.input]
    graph.node.remove(q)
    graph.node.remove(dq)
    return out


WIDE, CHANNELS = 192, 64      # the wide net's image side and channels: 9 MiB a float tensor, a sample


def wide_conv(seed: int = 0) -> onnx.ModelProto:
    """x [N,1,192,192] -> conv1 (64 channels) -> relu1 -> `wide` -> conv2 (1 channel) -> pool -> y [N,1,1,1]: a tiny
    file whose tensors are large (about 12 MB a sample to dump, FP32 and INT8 together), as a detector's are."""
    rng = np.random.default_rng(seed)
    node = helper.make_node
    graph = helper.make_graph(
        [node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         node("Relu", ["c1"], ["wide"], name="relu1"),
         node("Conv", ["wide", "w2", "b2"], ["c2"], name="conv2"),
         node("GlobalAveragePool", ["c2"], ["y"], name="pool")],
        "wide_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, WIDE, WIDE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 1, 1])],
        [numpy_helper.from_array(rng.standard_normal((CHANNELS, 1, 3, 3)).astype(np.float32), "w1"),
         numpy_helper.from_array(np.full(CHANNELS, 0.1, np.float32), "b1"),
         numpy_helper.from_array((rng.standard_normal((1, CHANNELS, 1, 1)) / 8).astype(np.float32), "w2"),
         numpy_helper.from_array(np.zeros(1, np.float32), "b2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", modelkit.OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_wide_set(folder: Path, n_eval: int = 32) -> dict[str, Path]:
    """The wide net in FP32, its INT8 with the default [-6, 6] range at `wide` (which reaches about 10), the
    evaluation and calibration images."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    fp32 = modelkit.write(wide_conv(), folder / "wide-fp32.onnx")
    cal = {"x": rng.uniform(-1, 1, (8, 1, WIDE, WIDE)).astype(np.float32)}
    np.savez(folder / "wide-cal.npz", **cal)
    int8 = modelkit.quantize_qdq(fp32, folder / "wide-int8.onnx", cal)
    bad = modelkit.write(with_tensor_range(onnx.load(int8), "wide"), folder / "wide-default-range.onnx")
    np.savez(folder / "wide-eval.npz", x=rng.uniform(-1, 1, (n_eval, 1, WIDE, WIDE)).astype(np.float32))
    return {"fp32": fp32, "int8": int8, "default_range": bad, "eval": folder / "wide-eval.npz",
            "cal": folder / "wide-cal.npz"}


def digits_mlp(hidden: int = 32) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """scikit-learn's digits (1,797 real 8x8 images) through an MLP as exporters write it, nodes unnamed:
    x [N,64] -> Gemm -> Relu -> r -> Gemm -> logits [N,10] (random features, a ridge read-out: about 83 % right).
    Returns (model, images, labels)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    rng = np.random.default_rng(0)
    w1, b1 = rng.standard_normal((64, hidden)).astype(np.float32), np.full(hidden, 0.5, np.float32)
    h = np.maximum(x @ w1 + b1, 0)
    w2 = np.linalg.solve(h.T @ h + 0.1 * np.eye(hidden), h.T @ np.eye(10)[y]).astype(np.float32)
    node = helper.make_node
    graph = helper.make_graph(
        [node("Gemm", ["x", "W1", "b1"], ["h"]), node("Relu", ["h"], [TENSOR]), node("Gemm", [TENSOR, "W2", "b2"],
                                                                                    ["logits"])],
        "digits_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "W2"),
         numpy_helper.from_array(np.zeros(10, np.float32), "b2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", modelkit.OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, x, y


def write_digits_set(folder: Path) -> dict[str, Path]:
    """The digits MLP in FP32, its INT8 (quantize_static fuses the Relu into the first Gemm, which then writes
    r) with r given the default [-6, 6] range, 200 calibration images and the other 1,597 labelled."""
    folder.mkdir(parents=True, exist_ok=True)
    model, x, y = digits_mlp()
    fp32 = modelkit.write(model, folder / "digits-fp32.onnx")
    int8 = modelkit.quantize_qdq(fp32, folder / "digits-int8.onnx", {"x": x[:200]})
    bad = modelkit.write(with_tensor_range(onnx.load(int8), TENSOR), folder / "digits-default-range.onnx")
    np.savez(folder / "digits-cal.npz", x=x[:200])
    np.savez(folder / "digits-eval.npz", x=x[200:], labels=y[200:])
    return {"fp32": fp32, "default_range": bad, "cal": folder / "digits-cal.npz", "eval": folder / "digits-eval.npz"}
