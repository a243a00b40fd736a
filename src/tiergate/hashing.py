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


# A user metric's code: its file, the local modules it imports, and the regular files of its folder.
METRIC_FOLDER_MAX_FILES = 2000           # more files in a metric's folder (recursively) is refused
METRIC_CONTENT_MAX_BYTES = 4 * 1024 ** 2  # a bigger file in the folder is named by its size and mtime


def metric_code_files(main: Path, imported=()) -> list[Path]:
    """The files a user metric's identity covers: `main`, the regular files under its folder (recursively, no
    __pycache__ and no dot folders or files) and the `imported` module files (those outside the folder)."""
    main = Path(main).resolve()
    files = {main}
    for folder, dirs, names in os.walk(main.parent):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in names:
            path = Path(folder) / name
            if not name.startswith(".") and not name.endswith(".pyc") and path.is_file() and not path.is_symlink():
                files.add(path)
        if len(files) > METRIC_FOLDER_MAX_FILES:
            raise InputError(f"metric {main}: its folder {main.parent} holds more than {METRIC_FOLDER_MAX_FILES} "
                             "files (all of them are in the decision's identity); put the metric in a folder of "
                             "its own")
    files.update(Path(p).resolve() for p in imported)
    return sorted(files)


def metric_code_sha256(main: Path, imported=()) -> str:
    """One hash over metric_code_files: each file's path and content (a file over METRIC_CONTENT_MAX_BYTES: its
    size and mtime); a file that is gone hashes as gone."""
    digest = hashlib.sha256()
    folder = Path(main).resolve().parent
    for path in metric_code_files(main, imported):
        name = path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)
        digest.update(name.encode() + b"\0")
        try:
            stat = path.stat()
            if stat.st_size > METRIC_CONTENT_MAX_BYTES:
                digest.update(f"size={stat.st_size} mtime_ns={stat.st_mtime_ns}".encode())
            else:
                digest.update(file_sha256(path).encode())
        except OSError:
            digest.update(b"gone")
        digest.update(b"\0")
    return digest.hexdigest()
