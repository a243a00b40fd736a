"""Content hashes of files: the one home for "sha256 of this file"."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tiergate.errors import InputError


def file_sha256(path: Path | str) -> str:
    """Hex sha256 of a file's bytes, read in blocks (large models never sit in memory whole)."""
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def safe_location(model_path: Path, location: str) -> Path:
    """The file an ONNX external-data location names, or InputError when it leaves the model's folder."""
    folder = Path(model_path).resolve().parent
    if not location or "\x00" in location:
        raise InputError(f"{model_path}: external data location {location!r} is not a file name")
    target = Path(os.path.realpath(folder / location))  # follows symlinks and '..'
    if not target.is_relative_to(folder):
        raise InputError(
            f"{model_path}: external data location {location!r} escapes the model's folder "
            f"(resolves outside {folder}); refused"
        )
    if not target.is_file():
        raise InputError(f"{model_path}: external data file {location!r} does not exist next to the model")
    return target


def read_external(model_path: Path, locations, digest) -> dict[str, bytes]:
    """Each external-data file's bytes by location (checked first), fed into `digest` in sorted order after the
    model file's own bytes: an ONNX artifact's sha256 (intake's, and the fast path's without loading onnx)."""
    files = {location: safe_location(model_path, location) for location in set(locations)}
    contents: dict[str, bytes] = {}
    for location in sorted(files):
        contents[location] = files[location].read_bytes()
        digest.update(location.encode() + b"\x00")
        digest.update(contents[location])
    return contents
