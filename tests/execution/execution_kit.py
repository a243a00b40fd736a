"""Data, host references, device classes and images for the execution tests (models: tests/modelkit.py)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tiergate.targets import resolve

N_FEATURES = 8
N_OUT = 4


def eval_data(path: Path, n: int = 10, seed: int = 1, name: str = "x") -> Path:
    rng = np.random.default_rng(seed)
    np.savez(path, **{name: rng.standard_normal((n, N_FEATURES)).astype(np.float32),
                      "labels": rng.integers(0, N_OUT, n)})
    return path


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


def looping(path: Path) -> Path:
    """y = x after a Loop of 2**62 trips (an Identity body): never ends on any CPU; the signature stays simple."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["v_in"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["N", N_FEATURES])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["N", N_FEATURES])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)], "looping",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", N_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", N_FEATURES])],
        [helper.make_tensor("trips", TensorProto.INT64, [], [2 ** 62]), helper.make_tensor("go", TensorProto.BOOL, [], [True])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path

