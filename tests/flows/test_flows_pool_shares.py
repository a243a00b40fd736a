"""An emulated tier spread over the workers of a work pool (issue 46, item 3): two Prefect process workers on this
machine, each with a Docker engine of its own (worker A: a second dockerd on its own socket and data root, listening
on nothing but its unix socket; worker B: the machine's engine), each running its share of the arm64 tier's samples
in its own containers; the shares merged in sample order give the one-machine run's decision; a worker killed
mid-share has its share run again by the other, and nothing the other measured is lost."""

from __future__ import annotations

import contextvars
import os
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import flows_kit as kit
import gatekit
import modelkit

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.emulated, pytest.mark.prefect]

ARM = "arm64-cpu-onnxruntime"
POOL = "tiergate-test-arm64-farm"
N = 256                    # two shares of 128 (a share holds at least the class's shard_samples, 64)


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """A Prefect server, a registry and store the workers share, the run-target deployment on POOL, a second
    dockerd holding the arm64 base and runtime images, and the case's models registered."""
    import docker
    from prefect.settings import (PREFECT_API_URL, PREFECT_HOME, PREFECT_LOCAL_STORAGE_PATH,
                                  PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings)

    from tiergate.build import ensure_runtime_image
    from tiergate.orchestration.deployments import deploy_run_target
    from tiergate.registry import Registry
    from tiergate.registry.intake import register_artifact
    from tiergate.targets import resolve

    folder = tmp_path_factory.mktemp("farm")
    rng = np.random.default_rng(4646)
    w = rng.normal(size=(8, 4))
    ref = modelkit.write(modelkit.linear(w, softmax=True), folder / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + rng.normal(0, 0.3, w.shape), softmax=True), folder / "cand.onnx")
    engine = kit.SecondEngine(Path(f"/tmp/tg-dockerd-{os.getpid()}-farm"))
    engine.folder.mkdir(exist_ok=True)
    with kit.prefect_server(folder) as (api_url, env), pytest.MonkeyPatch.context() as mp:
        try:
            engine.start()
            (dc,) = resolve([ARM])
            main = docker.from_env()
            runtime = ensure_runtime_image(dc, client=main)
            main.close()
            engine.load_from_machine_engine(dc.base_image, runtime.tag)
            registry_url, store = f"sqlite:///{folder / 'registry.db'}", folder / "store"
            with Registry(registry_url, store) as registry:
                register_artifact(registry, cand, model="farm", reference=ref)
            for key in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH"):
                mp.setenv(key, env[key])
            mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
            mp.setenv("TIERGATE_POOL_STALE_S", "6")            # a dead worker's share is run again after 6 s
            settings = {PREFECT_API_URL: api_url, PREFECT_HOME: env["PREFECT_HOME"],
                        PREFECT_LOCAL_STORAGE_PATH: env["PREFECT_LOCAL_STORAGE_PATH"],
                        PREFECT_SERVER_ANALYTICS_ENABLED: False}
            with temporary_settings(updates=settings):
                deploy_run_target(POOL)
                yield SimpleNamespace(folder=folder, env=env, api_url=api_url, engine=engine, cand=cand, ref=ref,
                                      registry_url=registry_url, store=str(store), rng=rng)
        finally:
            engine.stop()
            subprocess.run(["rm", "-rf", str(engine.folder)], check=False)


def _worker(farm, name: str, docker_host: str | None, tmp_path: Path) -> subprocess.Popen:
    """A process worker of POOL, one share at a time, its own tiergate home, on the given engine."""
    env = {**farm.env, "TIERGATE_HOME": str(tmp_path / f"home-{name}"), "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    env.pop("DOCKER_HOST", None)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    log = tmp_path / f"worker-{name}.log"
    proc = kit.start([kit.PREFECT, "worker", "start", "--pool", POOL, "--type", "process", "--limit", "1",
                      "--name", f"{POOL}-{name}-{os.getpid()}"], log, env)
    kit.wait_for(lambda: f"{POOL}-{name}-{os.getpid()}" in _online(farm), 60, f"worker {name} online", proc=proc,
                 log=log)
    return proc


def _online(farm) -> set[str]:
    return {w["name"] for w in kit.api_filter(farm.api_url, f"work_pools/{POOL}/workers")
            if w.get("status") == "ONLINE"}


def _pool_gate(farm, data: Path, result: dict) -> None:
    """The arm64 tier's gate with its samples in two shares on POOL (into result["run"], or result["error"])."""
    from tiergate.orchestration.gating import Remote, flow_seams
    from tiergate.orchestrator.seams import ThreadSteps
    from tiergate.policy import load_policy
    from tiergate.targets import resolve

    remote = Remote({ARM: POOL}, str(data), farm.registry_url, farm.store)
    try:
        result["run"] = gatekit.gate(farm.cand, farm.ref, data, resolve([ARM]), load_policy(None), early_stop=False,
                                     seams=flow_seams(remote, steps=ThreadSteps()), shards=2)
    except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
        result["error"] = exc


@pytest.fixture(scope="module")
def case(farm, tmp_path_factory):
    """The evaluation data, and the arm64 tier's decision on it made on this machine alone."""
    from tiergate.policy import load_policy
    from tiergate.targets import resolve

    folder = tmp_path_factory.mktemp("farm-case")
    x = np.random.default_rng(1).normal(size=(N, 8)).astype(np.float32)
    data = folder / "eval.npz"
    np.savez(data, x=x, labels=(x @ np.ones((8, 4)) + x[:, :4]).argmax(1).astype(np.int64))
    with gatekit.home_at(folder / "alone-home"):
        alone = gatekit.gate(farm.cand, farm.ref, data, resolve([ARM]), load_policy(None), early_stop=False)
    return data, alone


def _running(farm, before: set[str]) -> list[dict]:
    return [r for r in _flow_runs(farm) if r["id"] not in before and (r.get("state") or {}).get("type") == "RUNNING"]


def _flow_runs(farm) -> list[dict]:
    return kit.api_filter(farm.api_url, "flow_runs", {"deployments": {"name": {"any_": [POOL]}}})


def _same_decision(pooled, alone) -> None:
    """The verdict and every check of the one-machine run, its values equal up to float rounding (the shares'
    batched calls are other calls than one container's: onnxruntime's arm64 kernels are not batch-invariant to the
    last bit); latency (emulated, never gated) apart."""
    def checks(run):
        return {(c.device_class, c.name): c for c in run.decision.checks if "latency" not in c.name}

    assert pooled.decision.verdict == alone.decision.verdict, (pooled.decision.reasons, alone.decision.reasons)
    mine, theirs = checks(pooled), checks(alone)
    assert mine.keys() == theirs.keys()
    for key, check in mine.items():
        assert (check.passed, check.inconclusive) == (theirs[key].passed, theirs[key].inconclusive), key
        if isinstance(check.value, float):
            assert check.value == pytest.approx(theirs[key].value, rel=1e-4, abs=1e-6), key


def _shards(run) -> list[dict]:
    from tiergate import results

    return results.load(run.run_dirs[("candidate", ARM)]).extra["shards"]


def test_two_workers_with_engines_of_their_own_give_the_one_machine_decision(farm, case, tmp_path, monkeypatch):
    """Worker A (the second dockerd) takes a share; then worker B (the machine's engine) starts and takes the
    other (each runs one share at a time: the order is made, not raced). The shares come back merged in sample
    order and decide as the one machine did."""
    data, alone = case
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "gate-home"))
    before = {r["id"] for r in _flow_runs(farm)}
    result: dict = {}
    a = _worker(farm, "a", farm.engine.host, tmp_path)
    try:
        # the thread sees this test's Prefect settings (a new thread starts with an empty context)
        gate = threading.Thread(target=contextvars.copy_context().run, args=(_pool_gate, farm, data, result),
                                daemon=True)
        gate.start()
        kit.wait_for(lambda: _running(farm, before), 300, "worker A running a share", interval_s=0.5)
        b = _worker(farm, "b", None, tmp_path)
        try:
            gate.join(600)
        finally:
            kit.stop(b)
    finally:
        kit.stop(a)
    assert not gate.is_alive() and "error" not in result, result.get("error")
    pooled = result["run"]
    _same_decision(pooled, alone)
    shards = _shards(pooled)
    assert [s["samples"] for s in shards] == [[0, N // 2], [N // 2, N]]           # merged in sample order
    assert sorted(s["worker"]["engine"] for s in shards) == sorted([farm.engine.host, "local"])
    runs = [r for r in _flow_runs(farm) if r["id"] not in before]
    assert len(runs) == 2 and all(kit.completed(r) for r in runs), [r["state"] for r in runs]
    assert sorted(r["parameters"]["samples"] for r in runs) == [[0, N // 2], [N // 2, N]]
    assert all(set(r["parameters"]["artifacts"]) == {"candidate", "reference"} for r in runs)   # one start a share


def test_a_worker_killed_mid_share_has_its_share_run_again_by_the_other(farm, case, tmp_path, monkeypatch):
    """Worker A is killed (SIGKILL to the worker and to the flow run it started) while its share's container
    runs on its engine: its heartbeat stops, the share is cancelled and run again, by worker B; B's own share is
    kept (run once), and the decision is the one machine's. The order is made, not raced: A's container is paused
    (the cgroup freezer) as soon as it runs, well before its harness can have imported onnxruntime under QEMU, so
    its share cannot end before A is killed."""
    import signal

    data, alone = case
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "gate-home"))
    before = {r["id"] for r in _flow_runs(farm)}
    result: dict = {}
    client = farm.engine.client()
    a = _worker(farm, "a", farm.engine.host, tmp_path)
    b = share = None
    try:
        # the thread sees this test's Prefect settings (a new thread starts with an empty context)
        gate = threading.Thread(target=contextvars.copy_context().run, args=(_pool_gate, farm, data, result),
                                daemon=True)
        gate.start()
        (share,) = kit.wait_for(lambda: client.containers.list(filters={"label": f"org.tiergate.device_class={ARM}",
                                                                        "status": "running"}),
                                300, "worker A's share running in a container on its engine", interval_s=0.1)
        share.pause()                                          # stopped on the engine that dies with worker A
        (taken,) = _running(farm, before)                      # A's share, the one flow run running yet
        b = _worker(farm, "b", None, tmp_path)
        # worker A's machine dies: the worker and the flow run it started (a process group of its own)
        os.killpg(a.pid, signal.SIGKILL)
        os.kill(int(str(taken["infrastructure_pid"]).rsplit(":", 1)[-1]), signal.SIGKILL)   # "[host:]pid"
        gate.join(600)
    finally:
        if share is not None:                                  # what worker A left on its engine: gone
            for end in (share.unpause, share.kill):
                try:
                    end()
                except Exception:  # noqa: BLE001 - already running again, or gone
                    pass
        client.close()
        kit.stop(a)
        if b is not None:
            kit.stop(b)
    assert not gate.is_alive() and "error" not in result, result.get("error")
    pooled = result["run"]
    _same_decision(pooled, alone)
    assert [s["worker"]["engine"] for s in _shards(pooled)] == ["local", "local"]    # B ran both, in the end
    runs = [r for r in _flow_runs(farm) if r["id"] not in before]
    states = sorted((tuple(r["parameters"]["samples"]), r["state"]["type"]) for r in runs)
    killed = next(samples for samples, state in states if state == "CANCELLED")
    assert states == sorted([(killed, "CANCELLED"), (killed, "COMPLETED"),
                             (tuple({(0, N // 2), (N // 2, N)} - {killed})[0], "COMPLETED")]), states
