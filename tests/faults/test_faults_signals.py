"""Issue 42: SIGTERM (and SIGINT) stop `tiergate explain --fix` and `tiergate bisect` as they stop a gate: exit 143
with one line, no container or volume of the process left on the engine, no part folder left in the home. (Before,
only `gate` installed the handlers: explain exited 143 with no line and left a container, two volumes and a .part
folder.) The reference never finishes (an endless Loop, test_faults_docker._endless_model): the signal comes while
the process's container runs, whatever the CPU's speed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import modelkit
from faultkit import X86, error_lines
from test_faults_docker import SRC, _docker, _endless_model, _fast_model, _owned_by

pytestmark = [pytest.mark.faults, pytest.mark.docker]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["explain", "bisect"])
def test_sigterm_stops_explain_fix_and_bisect_cleanly(tmp_path, tiergate_home, command):
    data = tmp_path / "eval.npz"
    x = np.random.default_rng(7).normal(size=(64, 64)).astype(np.float32)
    np.savez(data, x=x)
    fast, slow = _fast_model(tmp_path / "fast.onnx"), _endless_model(tmp_path / "slow.onnx")
    candidate = modelkit.quantize_qdq(fast, tmp_path / "cand.onnx", {"x": x[:16]})
    args = {"explain": ["explain", "-c", str(candidate), "-r", str(slow), "-d", str(data), "-t", X86,
                        "--fix", str(tmp_path / "fixes"), "--calibration-data", str(data)],
            "bisect": ["bisect", "-c", str(candidate), "-r", str(slow), "-d", str(data), "-t", X86]}[command]
    env = {**os.environ, "PYTHONPATH": SRC, "TIERGATE_HOME": str(tiergate_home)}
    proc = subprocess.Popen([sys.executable, "-m", "tiergate.cli.main", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    client = _docker()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if [c for c in _owned_by(client, proc.pid)[0] if c["State"] == "running" and c["Command"] != "true"]:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    lines = error_lines(err)
    assert len(lines) == 1 and "interrupted by SIGTERM" in lines[0] and "Traceback" not in err, err[-3000:]
    containers, volumes = _owned_by(client, proc.pid)
    assert containers == [] and volumes == []
    assert not [p for p in tiergate_home.rglob("*") if ".part-" in p.name]
