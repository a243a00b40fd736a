"""Tiny models and data the execution tests make themselves, and host references."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tiergate.targets import resolve

N_FEATURES = 8
N_OUT = 4


def onnx_mlp(path: Path, batch: int | str = "N", seed: int = 0) -> Path:
    """y = relu(x @ W + B): input x [batch, 8] float32, output y [batch, 4]."""
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array(rng.standard_normal((N_FEATURES, N_OUT)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(N_OUT).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, N_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, N_OUT])],
        [weights, bias])
    return _save(graph, path)


def onnx_hungry(path: Path, rows: int = 8192, cols: int = 4096) -> Path:
    """y = x + sum(zeros[rows, cols]): a tiny file that needs rows*cols*4 bytes (128 MiB) to run."""
    shape = numpy_helper.from_array(np.array([rows, cols], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
         helper.make_node("Add", ["big", "big"], ["big2"]),
         helper.make_node("ReduceSum", ["big2"], ["s"], keepdims=0),
         helper.make_node("Mul", ["s", "zero"], ["s0"]),
         helper.make_node("Add", ["x", "s0"], ["y"])],
        "hungry",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", N_FEATURES]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", N_FEATURES])],
        [numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")])
    graph.input.pop()  # "shape" is an initializer, not an input
    graph.initializer.append(shape)
    return _save(graph, path)


def _save(graph, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def eval_data(path: Path, n: int = 10, seed: int = 1, name: str = "x") -> Path:
    rng = np.random.default_rng(seed)
    np.savez(path, **{name: rng.standard_normal((n, N_FEATURES)).astype(np.float32),
                      "labels": rng.integers(0, N_OUT, n)})
    return path


def tflite_models(folder: Path) -> dict[str, Path]:
    """An FP32 and a full-INT8 TFLite model of a small dense net (input [None, 8])."""
    import tensorflow as tf

    rng = np.random.default_rng(2)
    w1 = tf.constant(rng.standard_normal((N_FEATURES, 16)).astype(np.float32))
    w2 = tf.constant(rng.standard_normal((16, N_OUT)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, N_FEATURES], tf.float32, name="x")])
    def net(x):
        return tf.nn.softmax(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2))

    concrete = net.get_concrete_function()
    fp32 = tf.lite.TFLiteConverter.from_concrete_functions([concrete], net).convert()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], net)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        [rng.standard_normal((1, N_FEATURES)).astype(np.float32)] for _ in range(64))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.int8
    converter.inference_output_type = tf.int8
    int8 = converter.convert()
    paths = {"fp32": folder / "net_fp32.tflite", "int8": folder / "net_int8.tflite"}
    paths["fp32"].write_bytes(fp32)
    paths["int8"].write_bytes(int8)
    return paths


def tflite_input_name(path: Path) -> str:
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_path=str(path)).get_input_details()[0]["name"]


def host_onnx(model: Path, data: Path) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    with np.load(data) as npz:
        feed = {i.name: npz[i.name] for i in session.get_inputs()}
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))


def host_tflite(model: Path, data: Path) -> dict[str, np.ndarray]:
    """Per-sample LiteRT reference; int8 inputs quantized and outputs dequantized here, independently."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(model))
    interp.allocate_tensors()
    (inp,), outs = interp.get_input_details(), interp.get_output_details()
    with np.load(data) as npz:
        x = npz[inp["name"]]
    results = {o["name"]: [] for o in outs}
    for row in x:
        value = row[None]
        if inp["dtype"] == np.int8:
            scale, zero = inp["quantization"]
            value = np.clip(np.round(value / scale + zero), -128, 127).astype(np.int8)
        interp.set_tensor(inp["index"], value)
        interp.invoke()
        for o in outs:
            y = interp.get_tensor(o["index"])
            if o["dtype"] == np.int8:
                scale, zero = o["quantization"]
                y = (y.astype(np.float32) - zero) * scale
            results[o["name"]].append(y)
    return {k: np.concatenate(v) for k, v in results.items()}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def device_class(name: str, **changes):
    """A catalogue device class, optionally with other limits (memory=, timeout_s=) or fields."""
    dc = resolve([name])[0]
    limits = {k: changes.pop(k) for k in ("memory", "pids_limit", "timeout_s") if k in changes}
    if limits:
        changes["limits"] = dataclasses.replace(dc.limits, **limits)
    return dataclasses.replace(dc, **changes) if changes else dc


class Images:
    """Builds each (device class, artifact) image once per session."""

    def __init__(self):
        self.cache = {}

    def get(self, dc_name: str, artifact: Path):
        from tiergate.build import build_image

        key = (dc_name, artifact)
        if key not in self.cache:
            self.cache[key] = build_image(device_class(dc_name), artifact, artifact_sha256=sha256(artifact),
                                          fingerprint=f"test-{artifact.stem}")
        return self.cache[key]
