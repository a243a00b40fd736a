"""Session fixtures for the execution tests: models, data and images built once per session.

Images are tagged by content hash, so a second session on the same engine reuses
them without building (only the first run on a fresh machine pays the builds).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import execution_kit as kit
import modelkit as mk


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {
        "mlp": mk.write(mk.mlp(features=kit.N_FEATURES, outputs=kit.N_OUT), folder / "mlp.onnx"),
        "mlp_b1": mk.write(mk.mlp(batch=1, features=kit.N_FEATURES, outputs=kit.N_OUT), folder / "mlp_b1.onnx"),
        "mlp_v2": mk.write(mk.mlp(seed=7, features=kit.N_FEATURES, outputs=kit.N_OUT), folder / "mlp_v2.onnx"),
        "hungry": mk.write(mk.memory_hungry(features=kit.N_FEATURES), folder / "hungry.onnx"),
    }


@pytest.fixture(scope="session")
def tflite_models(tmp_path_factory) -> dict[str, Path]:
    return mk.tflite_mlp_pair(tmp_path_factory.mktemp("tflite"), kit.N_FEATURES, kit.N_OUT)


@pytest.fixture(scope="session")
def data(tmp_path_factory) -> Path:
    return kit.eval_data(tmp_path_factory.mktemp("data") / "eval.npz", n=10)


@pytest.fixture(scope="session")
def tflite_data(tmp_path_factory, tflite_models) -> Path:
    name = kit.tflite_input_name(tflite_models["fp32"])
    return kit.eval_data(tmp_path_factory.mktemp("tdata") / "eval.npz", n=10, name=name)


@pytest.fixture(scope="session")
def images() -> kit.Images:
    return kit.Images()

