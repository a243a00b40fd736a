"""Shared test plumbing: markers skip (with a reason) when the machine lacks a part.

Under CI (CI=true) a missing Docker engine or arm64 emulation is an error, not a
skip: those integration tests are the point of the product and must run there.
A missing GPU always skips.
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@lru_cache(maxsize=None)
def _engine_problem() -> str | None:
    try:
        import docker

        docker.from_env(timeout=10).ping()
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means no engine
        return f"no Docker engine answers ({type(exc).__name__}); run scripts/setup"


@lru_cache(maxsize=None)
def _emulation_problem() -> str | None:
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        return "arm64 emulation is not registered with binfmt_misc; run scripts/setup"
    return None


@lru_cache(maxsize=None)
def _gpu_problem() -> str | None:
    if not shutil.which("nvidia-smi"):
        return "no NVIDIA GPU on this machine (nvidia-smi not found)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    needs = {m.name for m in item.iter_markers()}
    for marker, probe, hard_in_ci in (
        ("docker", _engine_problem, True),
        ("emulated", _emulation_problem, True),
        ("emulated", _engine_problem, True),
        ("gpu", _gpu_problem, False),
    ):
        if marker in needs:
            problem = probe()
            if problem and hard_in_ci and IN_CI:
                pytest.fail(f"CI must run {marker} tests: {problem}")
            if problem:
                pytest.skip(problem)


@pytest.fixture
def tiergate_home(tmp_path, monkeypatch) -> Path:
    """A private TIERGATE_HOME (registry, store, results) for one test."""
    home = tmp_path / "tiergate-home"
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    return home
