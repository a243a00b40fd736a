"""ONNX external data, read only from inside the artifact's own folder.

Every location is checked before any file is opened: absolute paths and '..'
that leave the folder, and symbolic links whose target lies outside it, are
refused with InputError.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

from tiergate.errors import InputError
from tiergate.hashing import read_external, safe_location  # noqa: F401 - safe_location re-exported


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in _get_all_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL]


def load_external_data(model_path: Path, model: onnx.ModelProto, digest) -> tuple[tuple[str, ...], int]:
    """Check every location, then read the data into the tensors.

    Feeds each file into `digest`; returns the locations as written and their total size.
    """
    tensors = external_tensors(model)
    infos = [(t, _info(model_path, t)) for t in tensors]
    contents = read_external(model_path, [info.location for _, info in infos], digest)
    for tensor, info in infos:
        tensor.raw_data = _slice(model_path, contents[info.location], info)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    return tuple(sorted(contents)), sum(len(c) for c in contents.values())


def _info(model_path: Path, tensor: onnx.TensorProto) -> ExternalDataInfo:
    try:
        return ExternalDataInfo(tensor)
    except ValueError as exc:
        raise InputError(f"{model_path}: external data of tensor {tensor.name!r} is malformed ({exc})") from None


def _slice(model_path: Path, blob: bytes, info: ExternalDataInfo) -> bytes:
    offset = int(info.offset or 0)
    length = len(blob) - offset if info.length is None else int(info.length)
    if offset < 0 or length < 0 or offset + length > len(blob):
        raise InputError(
            f"{model_path}: external data {info.location!r} is too short "
            f"(needs bytes {offset}..{offset + length}, file has {len(blob)})"
        )
    return blob[offset:offset + length]
