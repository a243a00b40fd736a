"""The content-addressed store, on a real folder and on fsspec's in-memory filesystem."""

from __future__ import annotations

import uuid

import numpy as np
import onnxruntime as ort
import pytest
from registry_kit import make_onnx

from tiergate import results
from tiergate.errors import InputError
from tiergate.registry.store import Store, file_sha256


def _run(model_path):
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.arange(8, dtype=np.float32).reshape(2, 4)})[0]


def test_artifact_is_stored_under_its_hash_and_comes_back_whole(tmp_path):
    model = make_onnx(tmp_path / "in" / "any-name.onnx", seed=1)
    sha = file_sha256(model)
    store = Store(tmp_path / "store")
    key = store.put_artifact(model, sha, "onnx")
    assert key == f"{sha[:2]}/{sha}/model.onnx"
    assert (tmp_path / "store" / key).read_bytes() == model.read_bytes()
    fetched = store.fetch(key, tmp_path / "out")
    assert fetched.name == "model.onnx" and file_sha256(fetched) == sha
    assert not list((tmp_path / "store").rglob(".part-*"))


def test_storing_twice_keeps_the_first_copy(tmp_path):
    model = make_onnx(tmp_path / "m.onnx", seed=2)
    store = Store(tmp_path / "store")
    key = store.put_artifact(model, file_sha256(model), "onnx")
    first = (tmp_path / "store" / key).stat().st_mtime_ns
    assert store.put_artifact(model, file_sha256(model), "onnx") == key
    assert (tmp_path / "store" / key).stat().st_mtime_ns == first


def test_onnx_external_data_travels_with_the_model(tmp_path):
    model = make_onnx(tmp_path / "in" / "big.onnx", seed=3, external="weights/big.bin")
    store = Store(tmp_path / "store")
    key = store.put_artifact(model, "ab" * 32, "onnx", external_data=("weights/big.bin",))
    assert (tmp_path / "store" / key).parent.joinpath("weights", "big.bin").is_file()
    fetched = store.fetch(key, tmp_path / "elsewhere")
    np.testing.assert_array_equal(_run(fetched), _run(model))


def test_external_data_outside_the_folder_is_refused(tmp_path):
    model = make_onnx(tmp_path / "m.onnx", seed=4)
    with pytest.raises(InputError, match="leaves the model's folder"):
        Store(tmp_path / "store").put_artifact(model, "cd" * 32, "onnx", external_data=("../secret.bin",))
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*.onnx"))


def test_result_folder_round_trip(tmp_path):
    result = results.TargetResult(device_class="x86_64-cpu-onnxruntime", status="ok", latencies_ns=[10, 12],
                                  image_id="sha256:abc", data_sha256="d" * 64)
    outputs = {"y": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)}
    folder = results.save(result, tmp_path / "res", outputs)
    store = Store(tmp_path / "store")
    key = store.put_result(folder)
    assert key.startswith("results/") and store.put_result(folder) == key
    back = store.fetch(key, tmp_path / "back")
    assert results.load(back) == result
    np.testing.assert_array_equal(results.load_outputs(back)["y"], outputs["y"])


def test_a_folder_without_result_json_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no result.json"):
        Store(tmp_path / "store").put_result(tmp_path / "empty")


def test_fsspec_url_store(tmp_path):
    """Any fsspec URL works; memory:// is fsspec's real in-process filesystem."""
    model = make_onnx(tmp_path / "m.onnx", seed=5, external="m.bin")
    store = Store(f"memory://tiergate-{uuid.uuid4().hex}/store")
    sha = file_sha256(model)
    key = store.put_artifact(model, sha, "onnx", external_data=("m.bin",))
    assert store.url(key).startswith("memory://") and store.exists(key)
    fetched = store.fetch(key, tmp_path / "out")
    np.testing.assert_array_equal(_run(fetched), _run(model))
    store.remove(key)
    assert not store.exists(key)


def test_missing_entry_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="missing"):
        Store(tmp_path / "store").fetch("ab/" + "ab" * 32 + "/model.onnx", tmp_path / "out")
