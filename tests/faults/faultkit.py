"""Helpers of the fault suite: run the CLI in a subprocess, pick its error lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"


def cli(*args: str, env: dict | None = None, timeout: int = 600):
    """Run `tiergate` in a subprocess with this worktree's sources: (exit code, stdout, stderr)."""
    src = str(HERE.parent.parent / "src")
    full = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    done = subprocess.run([sys.executable, "-m", "tiergate.cli.main", *args], capture_output=True, text=True,
                          env=full, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tiergate: error:")]
