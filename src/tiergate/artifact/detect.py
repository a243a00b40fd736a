"""Reading a model file and telling its format from its bytes."""

from __future__ import annotations

from pathlib import Path

from tiergate.errors import InputError

TFLITE_IDENTIFIER = b"TFL3"
_ONNX_FIRST_BYTE = 0x08  # protobuf tag of ModelProto.ir_version (field 1, varint), written first


MAX_MODEL_BYTES = 2 << 30     # protobuf and flatbuffers both stop at 2 GiB (larger ONNX weights are external data)


def read_model_file(path: Path) -> bytes:
    """A model file's bytes: a regular file (never a FIFO or a device: paths.read_regular), at most 2 GiB."""
    from tiergate.paths import read_regular

    if not path.exists() and not path.is_symlink():
        raise InputError(f"{path}: does not exist")
    if path.is_dir():
        raise InputError(f"{path}: is a folder, not a model file")
    try:
        data = read_regular(path, "model file", MAX_MODEL_BYTES)
    except InputError as exc:
        raise InputError(exc.message.removeprefix("model file ")) from None
    if not data:
        raise InputError(f"{path}: is empty (0 bytes)")
    return data


def detect_format(path: Path, data: bytes) -> str:
    """'tflite' or 'onnx' from the content; anything else is refused."""
    if data[4:8] == TFLITE_IDENTIFIER:
        return "tflite"
    if data[0] == _ONNX_FIRST_BYTE:
        return "onnx"
    if path.suffix.lower() == ".tflite":
        raise InputError(f"{path}: is not a TFLite model (no 'TFL3' flatbuffer identifier)")
    raise InputError(f"{path}: is not an ONNX or TFLite model (neither a TFLite flatbuffer nor an ONNX protobuf)")
