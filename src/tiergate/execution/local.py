"""Local process backend: the harness under the host's Python, no Docker.

Used for host references (the FP32 model on the host's own onnxruntime/LiteRT)
and fast tests. It applies the device class's threads, batch size and timeout;
it does not confine memory, pids or the network (use a Docker backend for that).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tiergate.errors import InputError
from tiergate.execution.base import (Job, clear_outputs, exit_reason, host_fields, last_line,
                                     read_harness_result, tail)
from tiergate.paths import containers_dir
from tiergate.results import TargetResult, failed


class LocalProcessBackend:
    name = "local-process"

    def __init__(self, python: str | None = None):
        self.python = python or sys.executable

    def run(self, job: Job) -> TargetResult:
        dc = job.device_class
        if job.artifact_path is None:
            raise InputError(f"{dc.name}: the local process backend needs the artifact's path")
        clear_outputs(job.out_dir)
        host = host_fields(job)
        host["emulated"] = False
        cmd = [self.python, str(containers_dir() / "harness" / "tiergate_harness.py"),
               *job.harness_args(*(str(Path(p).resolve()) for p in (job.artifact_path, job.data_npz, job.out_dir)))]
        env = {**os.environ, **job.env, "PYTHONUNBUFFERED": "1"}
        with tempfile.TemporaryFile("w+") as log:
            try:
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      timeout=dc.limits.timeout_s, cwd=tempfile.gettempdir())
                code, timed_out = proc.returncode, False
            except subprocess.TimeoutExpired:
                code, timed_out = None, True
            log.seek(0)
            log_tail = tail(log.read())
        if timed_out:
            return failed(dc.name, f"timed out after {dc.limits.timeout_s} s", log_tail=log_tail, **host)
        if code != 0:
            reason = exit_reason(code)
            if code > 0:
                reason += f": {last_line(log_tail)}"
            return failed(dc.name, reason, log_tail=log_tail, **host)
        return read_harness_result(job, host, log_tail)

