"""TVM device classes (docs/tvm.md): a tiny generated ONNX model whose Reshape target is computed from its input's
symbolic batch (what the compile step makes static), its evaluation data, and one home for the module's runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tvmkit import tiny_net


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """The tiny model, its Celu twin, and 24 samples of evaluation data (no labels: drift only)."""
    folder = tmp_path_factory.mktemp("tvm-models")
    onnx.save(tiny_net(), folder / "tiny.onnx")
    onnx.save(tiny_net(celu=True), folder / "tiny_celu.onnx")
    x = np.random.default_rng(1).standard_normal((24, 3, 8, 8)).astype(np.float32)
    np.savez(folder / "data.npz", x=x)
    return {"model": folder / "tiny.onnx", "celu": folder / "tiny_celu.onnx", "data": folder / "data.npz"}


@pytest.fixture(scope="session")
def tvm_home(tmp_path_factory) -> Path:
    """One TIERGATE_HOME for the module's gates and inspects: each tier compiles each model once."""
    return tmp_path_factory.mktemp("tvm-home")
