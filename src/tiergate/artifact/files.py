"""The files an artifact is made of: the model file and, for ONNX, the external-data files it names (what an
image's artifact layer holds and what a shared container's data volume gets)."""

from __future__ import annotations

from pathlib import Path

from tiergate.errors import InputError
from tiergate.targets import DeviceClass


def artifact_files(dc: DeviceClass, path: Path) -> list[Path]:
    """The artifact file (first) and any ONNX external-data files it names; format checked."""
    if not path.is_file():
        raise InputError(f"{path}: artifact does not exist")
    from tiergate.artifact.detect import detect_format, read_model_file

    fmt = detect_format(path, read_model_file(path))   # from the content, never the file name
    if fmt != dc.artifact_format:
        raise InputError(f"{path}: a {fmt} artifact cannot run on {dc.name} "
                         f"(runtime {dc.runtime} needs {dc.artifact_format})")
    if fmt == "tflite":
        if path.read_bytes()[4:8] != b"TFL3":
            raise InputError(f"{path}: not a TFLite flatbuffer (no TFL3 identifier)")
        return [path]
    return [path, *onnx_external_files(path)]


def onnx_external_files(path: Path) -> list[Path]:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure is bad input
        text = " ".join(str(exc).split())[:400]
        raise InputError(f"{path}: not a readable ONNX model: {text}") from None
    names = set()
    for tensor in onnx.external_data_helper._get_all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in tensor.external_data if e.key == "location")
    files = []
    for name in sorted(names):
        target = (path.parent / name).resolve()
        if target.parent != path.parent.resolve() or not target.is_file():
            raise InputError(f"{path}: external data {name!r} must be a file next to the model")
        files.append(target)
    return files


def artifact_parts(path: Path) -> list[Path]:
    """The files besides `path` that an artifact is made of (an ONNX model's external data; none for TFLite),
    for checks on what a command may write (paths.check_outputs). Unreadable: InputError."""
    from tiergate.artifact.detect import detect_format, read_model_file

    if detect_format(path, read_model_file(path)) != "onnx":
        return []
    return onnx_external_files(path)
