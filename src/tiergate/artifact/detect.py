"""Reading a model file and telling its format from its bytes."""

from __future__ import annotations

from pathlib import Path

from tiergate.errors import InputError

TFLITE_IDENTIFIER = b"TFL3"
_ONNX_FIRST_BYTE = 0x08  # protobuf tag of ModelProto.ir_version (field 1, varint), written first


def read_model_file(path: Path) -> bytes:
    if not path.exists():
        raise InputError(f"{path}: does not exist")
    if path.is_dir():
        raise InputError(f"{path}: is a folder, not a model file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from None
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
