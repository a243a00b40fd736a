"""Cached folders (runtime graphs, compiled libraries, explain dumps, MLflow downloads): put in place in one rename
with a sealed manifest of their files, believed only while it verifies."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tiergate.hashing import file_sha256
from tiergate.state.seal import read_sealed, write_sealed

MANIFEST = "manifest.json"


def publish_folder(work: Path, folder: Path) -> None:
    """Put a finished cache folder in place in one rename (a concurrent twin may win: fine), with a sealed
    manifest naming every file's sha256 (none without a cache key: the folder is then made again next time)."""
    files = {p.relative_to(work).as_posix(): file_sha256(p) for p in sorted(work.rglob("*"))
             if p.is_file() and p.name != MANIFEST}
    write_sealed(work / MANIFEST, {"files": files})
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(work, folder)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not folder.is_dir():
            raise


def folder_verifies(folder: Path) -> bool:
    """A cache folder whose sealed manifest verifies and names exactly its files, each with the same sha256."""
    doc, _ = read_sealed(folder / MANIFEST)
    files = doc.get("files") if doc is not None else None
    if not isinstance(files, dict):
        return False
    try:
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST}
        return present == set(files) and all(file_sha256(folder / name) == sha for name, sha in files.items())
    except OSError:
        return False


def cached_folder(folder: Path, what: str) -> bool:
    """Whether a cache folder is there and verifies (folder_verifies); one that does not (truncated, edited,
    unsealed) is discarded with a warning, and the caller makes it again."""
    if not folder.is_dir():
        return False
    if folder_verifies(folder):
        return True
    discard_folder(folder, what, "it does not verify (truncated, edited, or made under another cache key)")
    return False


def discard_folder(folder: Path, what: str, why: str) -> None:
    print(f"tiergate: warning: discarding the cached {what} {folder.name}: {why}; making it again", file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
