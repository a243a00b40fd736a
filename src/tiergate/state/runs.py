"""Saved runs: a run folder put in place whole (`writing_folder`, `replace_dir`), sealed for its name with
exactly its files (`seal_run`, `run_sealed`), and believed only while it verifies (`run_verifies`, `verified`)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tiergate.errors import disk_full, is_disk_full
from tiergate.hashing import file_sha256
from tiergate.state.names import OUTPUTS_FILE, RESULT_FILE, SHARDS_SUFFIX, runs_root
from tiergate.state.seal import read_sealed, write_sealed
from tiergate.state.writing import part_path


def replace_dir(work: Path, folder: Path) -> None:
    """Put a finished folder in place (a rename in the same directory); the old one goes first. A run folder that
    holds an ok result is sealed first, for its final name (seal_run)."""
    if (work / RESULT_FILE).is_file():
        seal_run(work, folder)
    if folder.exists():
        old = folder.with_name(f"{folder.name}.old-{os.getpid()}-{threading.get_ident()}")
        folder.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    work.rename(folder)


@contextmanager
def writing_folder(folder: Path) -> Iterator[Path]:
    """Yield a fresh part folder; on success it replaces `folder`, on failure it is removed (a full disk
    raises the one-line EnvironmentProblem)."""
    work = part_path(folder)
    shutil.rmtree(work, ignore_errors=True)
    try:
        yield work
        folder.parent.mkdir(parents=True, exist_ok=True)
        replace_dir(work, folder)
    except BaseException as exc:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise disk_full(exc, folder.parent) from None
        raise


def read_result(folder: Path) -> dict | None:
    """A run folder's result.json as JSON, or None when it is missing or unreadable."""
    try:
        doc = json.loads((folder / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def run_verifies(folder: Path) -> bool:
    """A saved ok result whose outputs are the ones it names, sealed by this machine's key for this run's name with
    exactly its files (seal_run): a run edited, copied from another run's folder or from a home made elsewhere is
    never believed."""
    doc = read_result(folder)
    if doc is None or doc.get("status") != "ok" or not doc.get("outputs_sha256"):
        return False
    try:
        if file_sha256(folder / OUTPUTS_FILE) != doc["outputs_sha256"]:
            return False
    except OSError:
        return False
    return run_sealed(folder)


RUN_SEAL = "run.seal"            # in a run folder: the sealed list of its files and the run's name


def _run_name(folder: Path) -> str:
    """A run folder's name as its seal binds it: the run key, or KEY.shards/START-STOP for a shard."""
    parent = Path(folder).parent.name
    return f"{parent}/{Path(folder).name}" if parent.endswith(SHARDS_SUFFIX) else Path(folder).name


def _run_files(folder: Path) -> dict[str, str] | None:
    """Every file of a run folder with its sha256 (the seal aside); None when it holds a link or anything but files
    and folders (a sealed run never does)."""
    files = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            return None
        name = path.relative_to(folder).as_posix()
        if path.is_file() and name != RUN_SEAL:
            files[name] = file_sha256(path)
    return files


def seal_run(work: Path, final: Path) -> None:
    """Seal a finished ok run (in `work`, for its place `final`): its files' sha256 and its run's name under this
    machine's key (nothing without a usable key: the run is then not reused). Called by replace_dir, and after a
    run's result.json changes in place."""
    doc = read_result(work)
    (Path(work) / RUN_SEAL).unlink(missing_ok=True)
    if doc is None or doc.get("status") != "ok":
        return
    files = _run_files(work)
    if files is not None:
        write_sealed(Path(work) / RUN_SEAL, {"run": _run_name(final), "files": files}, sort_keys=True)


def run_sealed(folder: Path) -> bool:
    """The run folder's seal verifies under this machine's key, names this run, and lists exactly its files."""
    doc, _ = read_sealed(Path(folder) / RUN_SEAL)
    if doc is None or doc.get("run") != _run_name(folder):
        return False
    try:
        return doc.get("files") == _run_files(folder)
    except OSError:
        return False


def verified(folder: Path, *, quiet: bool = False) -> bool:
    """run_verifies; anything else is discarded (with a warning, unless `quiet`)."""
    if not (folder / RESULT_FILE).exists():
        return False
    if run_verifies(folder):
        return True
    if not quiet:
        print(f"tiergate: warning: discarding the saved run {folder.name} (failed, or it does not verify: edited, "
              "or not sealed by this machine's cache key); running it again", file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    return False


def run_label_hash(folder: Path) -> tuple[str, str]:
    """(`FOLDER:sha256 of result.json`, its image id): how a decision names the run it was made from."""
    raw = (folder / RESULT_FILE).read_bytes()
    return f"{folder.name}:{hashlib.sha256(raw).hexdigest()}", json.loads(raw).get("image_id", "")


def run_matches(folder: Path, inputs: dict, label: str) -> bool:
    """The run folder still holds the result a decision (its `inputs`) was made from, and it verifies."""
    if folder.parent != runs_root():
        return False
    try:
        named, image = run_label_hash(folder)
    except (OSError, ValueError):
        return False
    return inputs["runs"].get(label) == named and image == inputs["images"].get(label) and run_verifies(folder)
