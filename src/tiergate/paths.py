"""Where tiergate finds its catalogue, container recipes and working folders."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def project_root() -> Path:
    """The checkout holding targets/ and containers/ (TIERGATE_ROOT overrides)."""
    env = os.environ.get("TIERGATE_ROOT")
    if env:
        return Path(env).resolve()
    for parent in _PACKAGE_DIR.parents:
        if (parent / "targets").is_dir() and (parent / "containers").is_dir():
            return parent
    return Path.cwd()


def targets_dir() -> Path:
    return Path(os.environ.get("TIERGATE_TARGETS_DIR") or project_root() / "targets")


def containers_dir() -> Path:
    return project_root() / "containers"


def qemu_binary(name: str) -> Path:
    """A QEMU user-mode binary scripts/setup fetched (qemu-aarch64, qemu-x86_64): TIERGATE_SYSTEM_DIR/qemu/NAME."""
    return Path(os.environ.get("TIERGATE_SYSTEM_DIR") or "/opt/tiergate") / "qemu" / name


def home() -> Path:
    """tiergate's working state: registry, artifact store, run results, caches."""
    path = Path(os.environ.get("TIERGATE_HOME") or Path.cwd() / ".tiergate")
    return path
