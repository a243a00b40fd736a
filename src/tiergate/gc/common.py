"""What the gc package's modules share: the labels and names gc goes by, its ledger of images still to remove,
durations and sizes as a person writes them, and image ids compared by their first 12 hex digits."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tiergate import state
from tiergate.errors import InputError
from tiergate.images import LABEL

ARTIFACT_LABEL = f"{LABEL}.artifact.sha256"
DEVICE_CLASS_LABEL = f"{LABEL}.device_class"
RUNTIME_LABEL = f"{LABEL}.runtime"
RUNTIME_IMAGE_LABEL = f"{LABEL}.runtime_image"
JOB_LABEL = f"{LABEL}.job"
BASE_PREFIX = "tiergate/base:"
OWN_PREFIX = "tiergate/"
DEFAULT_KEEP_LAST = 3
GRACE = timedelta(hours=1)   # engine-shared leftovers and, while a gate runs, anything this recent
APPLY_ORDER = ("container", "volume", "decision", "run", "compiled", "mlflow", "image")
LEDGER = "gc-images.json"    # image ids of removed runs whose image could not be removed yet
RUNNING = ("running", "restarting", "paused", "removing")


def read_ledger(home: Path) -> set[str]:
    try:
        return set(json.loads((home / LEDGER).read_text()).get("images", []))
    except (OSError, ValueError, AttributeError):
        return set()


def write_ledger(home: Path, images: set[str]) -> None:
    path = home / LEDGER
    if not images:
        path.unlink(missing_ok=True)
        return
    state.write_json(path, {"images": sorted(images)})


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """'30d', '12h', '90m', '2w', '45s' (or '0')."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not match or (not match[2] and float(match[1]) != 0):
        raise InputError(f"--older-than {text!r} is not a duration such as 30d, 12h, 90m, 2w")
    try:
        age = timedelta(seconds=float(match[1]) * _UNITS.get(match[2] or "s", 1))
        datetime.now(timezone.utc) - age        # an age reaching before year 1 cannot be compared either
    except (OverflowError, ValueError):
        raise InputError(f"--older-than {text!r} is too long (at most {_MAX_DAYS} days)") from None
    return age


_MAX_DAYS = (datetime.now(timezone.utc) - datetime.min.replace(tzinfo=timezone.utc)).days - 1


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def span(delta: timedelta | None) -> str:
    seconds = int((delta or timedelta(0)).total_seconds())
    for unit, width in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= width and seconds % width == 0:
            return f"{seconds // width}{unit}"
    return f"{seconds}s"


def short(sha: str | None) -> str:
    return (sha or "?")[:12]


def image_key(image_id: str) -> str:
    """Image ids with or without 'sha256:', and short ones, compare equal by their first 12 hex digits."""
    return image_id.split(":", 1)[-1][:12] if image_id else ""


def epoch(value) -> datetime | None:
    try:
        return datetime.fromtimestamp(int(value), timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
