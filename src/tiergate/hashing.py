"""Content hashes of files: the one home for "sha256 of this file"."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path | str) -> str:
    """Hex sha256 of a file's bytes, read in blocks (large models never sit in memory whole)."""
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()
