"""A part a test needs, found missing inside the test (a mount the kernel refuses): strict as the markers of
tests/conftest.py are (the test fails with the cause); TIERGATE_ALLOW_SKIP=1 makes it a skip, for a laptop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ALLOW_SKIP = os.environ.get("TIERGATE_ALLOW_SKIP", "").lower() in ("1", "true", "yes")


def missing_part(part: str, problem: str) -> None:
    if ALLOW_SKIP:
        pytest.skip(f"{part}: {problem}")
    pytest.fail(f"{part} test cannot run: {problem} (set TIERGATE_ALLOW_SKIP=1 to skip these tests instead)",
                pytrace=False)


def tiny_tmpfs(mount: Path, size: str = "64k") -> Path:
    """`mount` made a tmpfs of `size` (the caller unmounts it): a real full disk (needs root: mark the test `root`)."""
    mount.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)]).returncode != 0:
        missing_part("tmpfs", "cannot mount a tmpfs here")
    return mount
