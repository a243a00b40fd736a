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
from tiergate.execution.base import (Job, clear_outputs, exit_reason, harness_command, harness_spoke, host_fields,
                                     last_line, read_harness_result, start_timeout, tail)
from tiergate.paths import containers_dir
from tiergate.results import TargetResult, failed


class LocalProcessBackend:
    name = "local-process"
    takes_samples = True      # runs a range of the samples (Job.samples): shards

    def __init__(self, python: str | None = None):
        self.python = python or sys.executable

    def run(self, job: Job) -> TargetResult:
        return self.run_many([job])[0]

    def run_many(self, jobs: list[Job]) -> list[TargetResult]:
        """Every job in one harness process (the runtime imported and the data read once)."""
        dc, first = jobs[0].device_class, jobs[0]
        for job in jobs:
            if job.artifact_path is None:
                raise InputError(f"{dc.name}: the local process backend needs the artifact's path")
            clear_outputs(job.out_dir)
        hosts = [{**host_fields(job), "emulated": False} for job in jobs]
        cmd = [self.python, str(containers_dir() / "harness" / "tiergate_harness.py"),
               *harness_command(jobs, [str(Path(j.artifact_path).resolve()) for j in jobs],
                                str(Path(first.data_npz).resolve()), [str(Path(j.out_dir).resolve()) for j in jobs],
                                [[str(Path(p).resolve()) for p in j.pair_with] for j in jobs])]
        env = {**os.environ, **first.env, "PYTHONUNBUFFERED": "1"}
        timeout = start_timeout(jobs)
        with tempfile.TemporaryFile("w+") as log:
            try:
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      timeout=timeout, cwd=tempfile.gettempdir())
                code, timed_out = proc.returncode, False
            except subprocess.TimeoutExpired:
                code, timed_out = None, True
            log.seek(0)
            log_tail = tail(log.read())
        if timed_out:
            reason = f"timed out after {timeout} s"
        elif code != 0:
            reason = exit_reason(code) + (f": {last_line(log_tail)}" if code > 0 else "")
        else:
            reason = None
        return [read_harness_result(job, host, log_tail) if reason is None or harness_spoke(job)
                else failed(dc.name, reason, log_tail=log_tail, **host) for job, host in zip(jobs, hosts)]
