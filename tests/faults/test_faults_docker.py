"""Faults with the real Docker engine: engine down, killed and signalled gates, concurrent gates, format by content.

Each case: the fault, the exit code and its one line, and that nothing was lost or leaked
(no container or volume of the gate left, finished run folders kept, no decision recorded).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from faultkit import X86, cli, error_lines
from tiergate import state
from tiergate.execution import janitor
from tiergate.registry import Registry, count_rows

pytestmark = [pytest.mark.faults, pytest.mark.docker]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _docker():
    import docker

    return docker.from_env()


def _owned_by(client, pid: int):
    label = f"{janitor.OWNER_PID}={pid}"
    return (client.containers.list(all=True, filters={"label": label}),
            client.volumes.list(filters={"label": label}))


def test_engine_unreachable_is_exit_2_and_records_no_decision(case, tmp_path):
    db = tmp_path / "reg.db"
    code, out, err = cli("gate", "-c", str(case["good"]), "-r", str(case["reference"]), "-d", str(case["data"]),
                         "-t", X86, "--registry", f"sqlite:///{db}",
                         env={"TIERGATE_HOME": str(case["home"]), "DOCKER_HOST": f"unix://{tmp_path}/dead.sock"})
    assert code == 2, err
    assert len(error_lines(err)) == 1 and "does not answer" in err and "REJECT" not in out + err
    with Registry(f"sqlite:///{db}", tmp_path / "store") as reg:
        assert count_rows(reg)["decisions"] == 0 and count_rows(reg)["runs"] == 0


def test_the_janitor_removes_what_a_killed_gate_left_and_nothing_else():
    client = _docker()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    labels_dead = {janitor.OWNER_HOST: janitor.hostname(), janitor.OWNER_PID: str(dead.pid),
                   janitor.OWNER_START: "1"}
    image = "tiergate/base:bookworm-amd64"
    left = client.containers.create(image, command=["true"], labels=labels_dead, network_mode="none")
    volume = client.volumes.create(f"tiergate-fault-{dead.pid}", labels=labels_dead)
    mine = client.containers.create(image, command=["true"], labels=janitor.owner_labels(), network_mode="none")
    try:
        swept = janitor.sweep(["local"])
        assert left.name in swept.containers and volume.name in swept.volumes
        assert mine.name not in swept.containers
        names = {c.name for c in client.containers.list(all=True)}
        assert left.name not in names and mine.name in names
    finally:
        for thing in (left, mine, volume):
            try:
                thing.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone is the point
                pass


def _slow_model(path: Path, size: int = 1024, depth: int = 24) -> Path:
    """A chain of `depth` MatMuls with one shared (size x size) weight: slow per sample, small on disk."""
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(size, size)))
    nodes, name = [], "x"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [name, "w"], [f"h{i}"]))
        name = f"h{i}"
    nodes.append(helper.make_node("Softmax", [name], ["probs"], axis=1))
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", size])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", size])],
                              [numpy_helper.from_array(q.astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_gate_removes_its_containers_and_keeps_what_finished(tmp_path, tiergate_home, signum):
    # the candidate (one MatMul) runs first and finishes; the signal comes while the slow reference runs
    fast, slow = _slow_model(tmp_path / "fast.onnx", depth=1), _slow_model(tmp_path / "slow.onnx")
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.random.default_rng(1).normal(size=(3000, 1024)).astype(np.float32))
    env = {**os.environ, "PYTHONPATH": SRC, "TIERGATE_HOME": str(tiergate_home)}
    gate = subprocess.Popen([sys.executable, "-m", "tiergate.cli.main", "gate", "-c", str(fast), "-r", str(slow),
                             "-d", str(data), "-t", X86, "--max-parallel", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = _docker()
    runs = tiergate_home / "runs"

    def finished():
        return [f for f in runs.iterdir() if ".part-" not in f.name and (f / "result.json").is_file()] \
            if runs.is_dir() else []

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and gate.poll() is None:
        running = [c for c in _owned_by(client, gate.pid)[0] if c.attrs["Config"]["Cmd"] != ["true"]]
        if running and finished():
            break
        time.sleep(0.5)
    assert gate.poll() is None, gate.communicate()
    time.sleep(2)                                        # the harness is running now
    sent = time.monotonic()
    gate.send_signal(signum)
    out, err = gate.communicate(timeout=60)
    took = time.monotonic() - sent
    assert gate.returncode == 128 + signum, err
    assert took < 15, f"exited {took:.1f} s after the signal"
    lines = error_lines(err)
    assert len(lines) == 1 and f"interrupted by {signal.Signals(signum).name}" in lines[0]
    assert "container(s)" in lines[0] and "kept" in lines[0]
    containers, volumes = _owned_by(client, gate.pid)
    assert containers == [] and volumes == []
    assert not list(runs.glob("*.part-*"))
    (kept,) = finished()                                  # the candidate's finished run is kept, and verifies
    from tiergate import state

    assert state.verified(kept) and "kept 1 finished run" in lines[0]


@pytest.mark.slow
def test_concurrent_gates_sharing_one_home_agree(case):
    env = {**os.environ, "PYTHONPATH": SRC, "TIERGATE_HOME": str(case["home"])}
    args = [sys.executable, "-m", "tiergate.cli.main", "gate", "-c", str(case["good"]), "-r", str(case["reference"]),
            "-d", str(case["data"]), "-t", X86, "--json"]
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    done = [(*p.communicate(timeout=600)[::-1], p.returncode)[::-1] for p in procs]
    codes = {code for code, _, _ in done}
    assert codes == {0}, [err[-500:] for _, _, err in done]
    verdicts = {json.loads(out)["verdict"] for _, out, _ in done}
    assert verdicts == {"PROMOTE"}
    # Runs of one key are shared (per-key lock); concurrent first builds of one image may give
    # different image ids (tiergate.build has no build lock), hence different keys: at most 2 per gate.
    started = sum(json.loads(out)["containers_started"] for _, out, _ in done)
    assert 2 <= started <= 8
    assert not list((case["home"] / "runs").glob("*.part-*"))
    from tiergate import state

    for folder in (case["home"] / "runs").iterdir():
        assert state.verified(folder), folder          # every kept run is whole


@pytest.mark.slow
@pytest.mark.tflite_extra
def test_a_tflite_file_named_onnx_is_gated_by_its_content(tmp_path, tiergate_home):
    import modelkit

    pair = modelkit.tflite_mlp_pair(tmp_path)
    fp32 = pair.get("fp32") or next(iter(pair.values()))
    disguised = tmp_path / "disguised.onnx"
    disguised.write_bytes(Path(fp32).read_bytes())
    rng = np.random.default_rng(0)
    from tiergate.artifact import load_artifact

    spec = load_artifact(fp32).inputs[0]
    x = rng.normal(size=(40, *[d for d in spec.shape[1:]])).astype(spec.dtype)
    data = tmp_path / "eval.npz"
    np.savez(data, **{spec.name: x})
    code, out, err = cli("gate", "-c", str(disguised), "-r", str(fp32), "-d", str(data), "-t", "x86_64-cpu-tflite",
                         "--json", env={"TIERGATE_HOME": str(tiergate_home)})
    assert code == 0, err
    assert json.loads(out)["verdict"] == "PROMOTE"
