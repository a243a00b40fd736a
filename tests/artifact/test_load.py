"""Loading ONNX and TFLite artifacts, and refusing unusable ones (one clear InputError each)."""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np
import onnx
import pytest

import modelkit as m
from tiergate.artifact import load_artifact
from tiergate.errors import InputError


def test_onnx_description(tmp_path):
    path = m.save(m.conv_net(batchnorm=True), "net.onnx", tmp_path)
    a = load_artifact(path)
    assert a.format == "onnx" and a.version == "opset 17"
    assert [(t.name, t.shape, t.dtype) for t in a.inputs] == [("x", (1, 3, 8, 8), "float32")]
    assert [(t.name, t.shape, t.dtype) for t in a.outputs] == [("y", (1, 4, 8, 8), "float32")]
    assert [n.op for n in a.nodes] == ["Conv", "BatchNormalization", "LeakyRelu", "Conv", "Relu", "Conv"]
    assert a.nodes[2].attributes["alpha"] == pytest.approx(0.1)
    assert a.initializers["w1"] == ((4, 3, 3, 3), "float32")
    assert a.tensor_dtypes["a1"] == "float32"  # inferred, not declared
    assert a.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert a.size_bytes == path.stat().st_size
    assert not a.is_quantized


def test_onnx_quantization_parameters_per_tensor():
    a = load_artifact(m.quantized_path())
    model = onnx.load(m.quantized_path())
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    q_input = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    params = a.quant[q_input.output[0]]
    assert params.scale == (pytest.approx(float(inits[q_input.input[1]])),)
    assert params.zero_point == (int(inits[q_input.input[2]]),)
    assert params.dtype == "uint8"
    weight = next(q for name, q in a.quant.items() if name.startswith("w1"))
    assert weight.dtype == "int8"


def test_tflite_description():
    path = m.save_tflite(m.tflite_bytes("int8"), "int8.tflite")
    a = load_artifact(path)
    assert a.format == "tflite" and a.version == "schema 3"
    assert [n.op for n in a.nodes] == ["CONV_2D", "CONV_2D", "CONV_2D"]
    assert a.nodes[0].attributes["fused_activation_function"] == "RELU"
    assert [(t.shape, t.dtype) for t in a.inputs] == [((1, 8, 8, 3), "int8")]
    assert a.inputs[0].name in a.quant and a.quant[a.inputs[0].name].dtype == "int8"
    per_channel = [q for name, q in a.quant.items() if name in a.initializers and len(q.scale) > 1]
    assert per_channel and all(q.axis == 0 for q in per_channel)
    assert a.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_format_is_read_from_content_not_suffix(tmp_path):
    onnx_named_oddly = m.save(m.conv_net(), "model.bin", tmp_path)
    tflite_named_onnx = m.save_tflite(m.tflite_bytes("float"), "model.onnx", tmp_path)
    assert load_artifact(onnx_named_oddly).format == "onnx"
    assert load_artifact(tflite_named_onnx).format == "tflite"


def _save_external(model, folder, location: str):
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    if location != "weights.bin":
        saved = onnx.load(folder / "model.onnx", load_external_data=False)
        for t in saved.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save(saved, folder / "model.onnx")
    return folder / "model.onnx"


def test_external_data_is_loaded_and_hashed(tmp_path):
    path = _save_external(m.conv_net(), tmp_path / "art", "weights.bin")
    a = load_artifact(path)
    assert a.external_data == ("weights.bin",)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in a.handle.graph.initializer}
    original = {t.name: onnx.numpy_helper.to_array(t) for t in m.conv_net().graph.initializer}
    assert all(np.array_equal(weights[k], original[k]) for k in original)
    expected = hashlib.sha256(path.read_bytes())
    expected.update(b"weights.bin\x00" + (tmp_path / "art" / "weights.bin").read_bytes())
    assert a.sha256 == expected.hexdigest()
    assert a.size_bytes == path.stat().st_size + (tmp_path / "art" / "weights.bin").stat().st_size


class _Opens:
    """Records every file Python opens (audit hook), while recording is on."""

    paths: list[str] = []
    on = False

    @classmethod
    def hook(cls, event, args):
        if cls.on and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            cls.paths.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_Opens.hook)


def _load_recording(path):
    _Opens.paths, _Opens.on = [], True
    try:
        return load_artifact(path)
    finally:
        _Opens.on = False


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_escaping_external_data_is_refused_and_never_read(tmp_path, how):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 4096)
    folder = tmp_path / "art"
    location = {"dotdot": "../secret.bin", "absolute": str(secret), "symlink": "weights.bin"}[how]
    path = _save_external(m.conv_net(), folder, location)
    if how == "symlink":
        (folder / "weights.bin").unlink()
        (folder / "weights.bin").symlink_to(secret)
    with pytest.raises(InputError) as err:
        _load_recording(path)
    assert str(path) in err.value.message and "escapes the model's folder" in err.value.message
    assert str(secret) not in _Opens.paths and not any(p.startswith(str(tmp_path / "secret")) for p in _Opens.paths)
    assert str(path.resolve()) in _Opens.paths  # the recorder works: it saw the model itself


def test_missing_external_file_is_refused(tmp_path):
    path = _save_external(m.conv_net(), tmp_path / "art", "weights.bin")
    (tmp_path / "art" / "weights.bin").unlink()
    with pytest.raises(InputError, match="does not exist next to the model"):
        load_artifact(path)


def test_short_external_file_is_refused(tmp_path):
    path = _save_external(m.conv_net(), tmp_path / "art", "weights.bin")
    blob = tmp_path / "art" / "weights.bin"
    blob.write_bytes(blob.read_bytes()[:100])
    with pytest.raises(InputError, match="too short"):
        load_artifact(path)


def _bad_files(tmp_path):
    onnx_bytes = m.conv_net().SerializeToString()
    tflite = m.tflite_bytes("float")
    files = {
        "empty.onnx": (b"", "is empty"),
        "truncated.onnx": (onnx_bytes[: len(onnx_bytes) // 2], "truncated or corrupt"),
        "truncated.tflite": (tflite[: len(tflite) // 3], "truncated or corrupt"),
        "notes.txt": (b"these are not the weights you are looking for\n", "is not an ONNX or TFLite model"),
        "random.tflite": (os.urandom(64).replace(b"TFL3", b"XXXX"), "is not a TFLite model"),
    }
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    return {tmp_path / name: problem for name, (_, problem) in files.items()}


def test_bad_files_raise_one_clear_input_error(tmp_path):
    for path, problem in _bad_files(tmp_path).items():
        with pytest.raises(InputError) as err:
            load_artifact(path)
        assert err.value.message.startswith(f"{path}: "), err.value.message
        assert problem in err.value.message, err.value.message
        assert "\n" not in err.value.one_line()


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_artifact(tmp_path / "nope.onnx")
    with pytest.raises(InputError, match="is a folder"):
        load_artifact(tmp_path)
