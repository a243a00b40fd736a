"""This machine as a class runs on it: the cores a run may use and the CPU (its model and the feature flags its
kernel reports). Callers call these through the module (`host.available_cores()`), so that a test patches them in
one place."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path


def available_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=1)
def host_cpu() -> tuple[str, frozenset[str]]:
    """(model name, feature flags) of this machine's CPU as its kernel reports them (/proc/cpuinfo)."""
    model, features = "", frozenset()
    try:
        text = CPUINFO.read_text()
    except OSError:
        return model, features
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu part") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not features:
            features = frozenset(value.split())
    return model, features


def host_cpu_key() -> str:
    model, features = host_cpu()
    return "host-" + hashlib.sha256(("\0".join([model, *sorted(features)])).encode()).hexdigest()[:12]
