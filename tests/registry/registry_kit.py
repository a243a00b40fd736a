"""Helpers for the registry tests: tiny real ONNX models made here, and a direct artifact record."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tiergate.registry import Registry
from tiergate.registry.store import file_sha256

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_onnx(path: Path, seed: int = 0, external: str | None = None) -> Path:
    """A tiny real ONNX classifier y = softmax(x @ W + b), weights from `seed`; optionally with external data."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.normal(size=(3,)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["y"], axis=-1)],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], initializer=[weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        (path.parent / external).parent.mkdir(parents=True, exist_ok=True)
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=external, size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path


def add(registry: Registry, path: Path, model: str = "digits", at: datetime | None = None, **fields):
    """Record a model file straight through Registry.add_artifact (no fingerprinting)."""
    return registry.add_artifact(path, sha256=file_sha256(path), model=model, format="onnx", precision="fp32",
                                 fingerprint={"structure": "test"}, at=at or T0, **fields)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)
