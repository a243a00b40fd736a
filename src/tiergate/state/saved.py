"""What `tiergate gc` reads of the home (`Saved`: a decision file, a run, compiled or MLflow folder) and the
removals it makes under a key's lock."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tiergate.state.locks import try_key_lock
from tiergate.state.names import COMPILE_SOURCE, COMPILED, DECISIONS, MLFLOW, RESULT_FILE, RUNS
from tiergate.state.runs import read_result
from tiergate.state.writing import parse_part


@dataclass
class Saved:
    """One saved thing under the home, as gc reads it: a decision file or a run folder."""

    path: Path
    key: str
    created: datetime | None
    size: int
    inputs: dict | None = None      # a decision's inputs (None: unreadable)
    artifact: str | None = None     # a run's artifact sha
    image_id: str = ""              # a run's image id


def entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def saved_decisions(root: Path) -> list[Saved]:
    return [_read_decision(p) for p in entries(root / DECISIONS) if p.is_file()]


def saved_runs(root: Path) -> list[Saved]:
    return [_read_run(p) for p in entries(root / RUNS) if p.is_dir()]


def saved_compiles(root: Path) -> list[Saved]:
    """The compile cache's folders (and part folders of compiles being written), each with its artifact's sha256
    when its source.json says it."""
    out = []
    for path in entries(root / COMPILED):
        if not path.is_dir():
            continue
        try:
            doc = json.loads((path / COMPILE_SOURCE).read_text())
        except (OSError, ValueError):
            doc = {}
        artifact = doc.get("artifact_sha256") if isinstance(doc, dict) else None
        out.append(Saved(path, path.name, datetime.fromtimestamp(path.stat().st_mtime, timezone.utc),
                         folder_size(path), artifact=artifact or None))
    return out


def saved_mlflow(root: Path) -> list[Saved]:
    """The MLflow download cache's folders (and part folders of downloads in progress), each with its artifact's
    sha256 when its identity file says it; never the watcher's state files (mlflow/watch-*.json)."""
    out = []
    for path in entries(root / MLFLOW):
        if not path.is_dir() or path.is_symlink():
            continue
        try:
            doc = json.loads((path / "identity.json").read_text())
        except (OSError, ValueError):
            doc = {}
        artifact = doc.get("artifact_sha256") if isinstance(doc, dict) else None
        out.append(Saved(path, path.name, datetime.fromtimestamp(path.stat().st_mtime, timezone.utc),
                         folder_size(path), artifact=artifact if isinstance(artifact, str) and artifact else None))
    return out


def _read_decision(path: Path) -> Saved:
    stat = path.stat()
    created = datetime.fromtimestamp(stat.st_mtime, timezone.utc)
    key, inputs = path.name.split(".", 1)[0], None
    if path.suffix == ".json":
        try:
            doc = json.loads(path.read_text())
            if isinstance(doc, dict) and isinstance(doc.get("inputs"), dict):
                inputs, key = doc["inputs"], str(doc.get("key") or key)
                created = parse_iso(doc.get("created_at")) or created
        except (OSError, ValueError):
            pass
    return Saved(path, key, created, stat.st_size, inputs=inputs)


def _read_run(path: Path) -> Saved:
    doc = read_result(path) or {}
    times = [p.stat().st_mtime for p in (path, path / RESULT_FILE) if p.exists()]
    return Saved(path, path.name, datetime.fromtimestamp(max(times), timezone.utc), folder_size(path),
                 artifact=doc.get("artifact_sha256") or None, image_id=doc.get("image_id") or "")


def folder_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def parse_iso(value) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        # Docker's CreatedAt may carry nanoseconds: 2024-01-02T03:04:05.123456789Z
        match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", str(value))
        if not match:
            return None
        when = datetime.fromisoformat(match[1]).replace(tzinfo=timezone.utc)
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def remove_compiled(path: Path, root: Path) -> str | None:
    """Remove a compiled library's folder under its compile's lock (tiergate.build.compiling.compiled); returns why it
    was kept, or None when removed."""
    return _remove_locked(path, root, f"compile-{path.name}", "a gate is compiling or reading this compile meanwhile")


def remove_run(path: Path, root: Path) -> str | None:
    """Remove a run folder under its key's lock (a gate that starts this run meanwhile waits, then re-runs
    it); returns why it was kept, or None when removed."""
    return _remove_locked(path, root, path.name, "a gate started this run meanwhile")


def _remove_locked(path: Path, root: Path, lock: str, busy: str) -> str | None:
    """Remove a folder under the key lock `lock` (a part folder at once); `busy` + "; kept" when it is held."""
    if parse_part(path.name) is not None:
        shutil.rmtree(path)
        return None
    with try_key_lock(lock, root) as got:
        if not got:
            return f"{busy}; kept"
        shutil.rmtree(path)
    return None
