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
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from faultkit import X86, cli, error_lines
from tiergate import state
from tiergate.execution import janitor
from tiergate.registry import Registry, count_rows, register_artifact

pytestmark = [pytest.mark.faults, pytest.mark.docker]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _docker():
    import docker

    return docker.from_env()


def _owned_by(client, pid: int):
    # the engine's own list, one call: the SDK's containers.list inspects each container afterwards, and
    # a container the gate removes in between raises NotFound (a race of the test, not of the gate)
    label = f"{janitor.OWNER_PID}={pid}"
    return (client.api.containers(all=True, filters={"label": label}),
            client.volumes.list(filters={"label": label}))


def test_engine_unreachable_is_exit_2_and_records_no_decision(case, tmp_path):
    db = tmp_path / "reg.db"
    with Registry(f"sqlite:///{db}", tmp_path / "store") as reg:      # registered: the engine is what fails
        register_artifact(reg, case["good"], model="faults", reference=case["reference"])
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
        names = {c.name for c in client.containers.list(all=True)}
        volumes = {v.name for v in client.volumes.list()}
        # what the killed gate left is gone: this sweep removed it, or another worker's gate swept first (every
        # gate sweeps at its start, with this same janitor); what a live process owns stays
        assert left.name not in names and volume.name not in volumes
        assert not swept.problems
        assert mine.name not in swept.containers and mine.name in names
    finally:
        for thing in (left, mine, volume):
            try:
                thing.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone is the point
                pass


SIZE = 64


def _signature_model(path: Path, nodes: list, inits: list, size: int = SIZE) -> Path:
    """x [N, size] -> nodes -> "h" -> Softmax -> probs [N, size]: every model here has the same signature."""
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.normal(size=(size, size)))              # orthogonal: repeated products stay finite
    nodes = [*nodes, helper.make_node("Softmax", ["h"], ["probs"], axis=1)]
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", size])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", size])],
                              [numpy_helper.from_array(q.astype(np.float32), "w"), *inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _fast_model(path: Path) -> Path:
    """One MatMul: done in milliseconds."""
    return _signature_model(path, [helper.make_node("MatMul", ["x", "w"], ["h"])], [])


def _endless_model(path: Path) -> Path:
    """A Loop of 2**63 - 1 MatMuls over the sample: never finishes, whatever the CPU's speed, so a test can signal
    while it runs without racing it (the class's timeout is far beyond any test's lifetime)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("MatMul", ["v_in", "w"], ["v_out"])],
        "forever",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["N", SIZE])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["N", SIZE])])
    loop = helper.make_node("Loop", ["trips", "go", "x"], ["h"], body=body)
    return _signature_model(path, [loop], [numpy_helper.from_array(np.array(2 ** 63 - 1, dtype=np.int64), "trips"),
                                           numpy_helper.from_array(np.array(True), "go")])


def test_the_endless_model_runs_on_and_has_the_fast_ones_signature(tmp_path):
    """The slow side of the signal test is slow by construction: a bounded trip count of the same graph gives
    the fast model's answer (so it computes what it claims), and the real one is still running when cut off."""
    import onnxruntime as ort

    from tiergate.artifact import load_artifact

    fast, endless = _fast_model(tmp_path / "fast.onnx"), _endless_model(tmp_path / "endless.onnx")
    a, b = load_artifact(fast), load_artifact(endless)
    assert (a.inputs, a.outputs) == (b.inputs, b.outputs)
    model = onnx.load(endless)
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array(1, dtype=np.int64), "trips"))
    once = tmp_path / "once.onnx"
    onnx.save(model, once)
    x = np.random.default_rng(2).normal(size=(3, SIZE)).astype(np.float32)
    run = {p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
           for p in (fast, once)}
    np.testing.assert_allclose(run[fast], run[once], rtol=1e-5)
    options = ort.RunOptions()
    session = ort.InferenceSession(str(endless), providers=["CPUExecutionProvider"])
    threading.Timer(1.0, options.__setattr__, ("terminate", True)).start()
    with pytest.raises(Exception, match="(?i)terminat"):
        session.run(None, {"x": x}, options)                  # still looping after a second: cut off


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_gate_removes_its_containers_and_keeps_what_finished(tmp_path, tiergate_home, signum):
    # the candidate (one MatMul) runs and finishes; the reference never finishes (an endless Loop, whatever the
    # CPU's speed): the signal comes once the candidate's run is saved and the harness's container runs
    fast, slow = _fast_model(tmp_path / "fast.onnx"), _endless_model(tmp_path / "slow.onnx")
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.random.default_rng(1).normal(size=(200, SIZE)).astype(np.float32))
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
        running = [c for c in _owned_by(client, gate.pid)[0] if c["Command"] != "true"]
        if running and finished():
            break
        time.sleep(0.2)
    assert gate.poll() is None, gate.communicate()
    assert finished(), "the candidate's run was not saved within 300 s"
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
    # Runs of one key are shared (per-key lock), and so are first builds of one image (the tag's build lock,
    # leases.building): one image id per artifact, so each of the two run keys runs once, whichever gate runs it.
    started = sum(json.loads(out)["containers_started"] for _, out, _ in done)
    assert started == 2
    assert not list((case["home"] / "runs").glob("*.part-*"))
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
