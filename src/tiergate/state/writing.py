"""Writing whole or not at all: the one part naming (`NAME.part-PID-TID`, which gc reads back to tell a live
writer from a dead one) and atomic file writes (a part file renamed into place; a full disk is the one-line
EnvironmentProblem of errors.disk_full)."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

from tiergate.errors import disk_full, is_disk_full

PART_MARK = ".part-"
_PART = re.compile(r"^(?P<key>.+?)(?P<ext>\.json)?\.part-(?P<pid>\d+)-[0-9a-z]+$")


def part_tag() -> str:
    """This process's and thread's part tag (a writer that spans threads takes one and passes it on)."""
    return f"{os.getpid()}-{threading.get_ident()}"


def part_path(final: Path, tag: str | None = None) -> Path:
    """Where `final` is written before it is renamed into place: one name per writer (process and thread)."""
    return final.with_name(f"{final.name}{PART_MARK}{tag or part_tag()}")


def temp_name(stem: str, unique: str) -> str:
    """A temporary name of the same family for a store that is not this machine's (a uuid, not a pid)."""
    return f"{stem}{PART_MARK}0-{unique}"


def is_part(name: str) -> bool:
    return PART_MARK in name


def parse_part(name: str) -> tuple[str, int] | None:
    """(the final name's key, the writer's pid) of a part name; None for any other name."""
    match = _PART.match(name)
    return (match["key"], int(match["pid"])) if match else None


def write_text(path: Path, text: str) -> Path:
    """Write a file atomically (part file + rename in the same folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = part_path(path)
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(exc, path.parent) from None
        raise
    return path


def write_json(path: Path, doc: dict, *, sort_keys: bool = False) -> Path:
    return write_text(path, json.dumps(doc, indent=1, sort_keys=sort_keys, allow_nan=False))
