"""The flows for real: a Prefect server on 127.0.0.1 (own SQLite), `tiergate serve`, `tiergate register`,
the triggered revalidation reaching Completed with a decision in the registry, the cache hit on an
unchanged re-run, the drift report over three registered artifacts, and a worker of a work pool running
a device class's runs. One server (and one `tiergate serve`) for the whole module.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import flows_kit as kit

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.prefect]

MODEL = "digits"
ONNX_CLASS = "x86_64-cpu-onnxruntime"
TFLITE_CLASS = "x86_64-cpu-tflite"
POOL = "tiergate-test-device-host"


@pytest.fixture(scope="module")
def served(tmp_path_factory, demo):
    """A Prefect server, this process pointed at it, and `tiergate serve` serving the three deployments."""
    from prefect.settings import (PREFECT_API_URL, PREFECT_HOME, PREFECT_LOCAL_STORAGE_PATH,
                                  PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings)

    folder = tmp_path_factory.mktemp("served")
    home = folder / "tiergate-home"
    with kit.prefect_server(folder) as (api_url, env), pytest.MonkeyPatch.context() as mp:
        env = {**env, "TIERGATE_HOME": str(home)}
        mp.setenv("TIERGATE_HOME", str(home))
        settings = {PREFECT_API_URL: api_url, PREFECT_HOME: env["PREFECT_HOME"],
                    PREFECT_LOCAL_STORAGE_PATH: env["PREFECT_LOCAL_STORAGE_PATH"],
                    PREFECT_SERVER_ANALYTICS_ENABLED: False}
        for key in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH"):
            mp.setenv(key, env[key])
        log = folder / "serve.log"
        serve = kit.start([kit.TIERGATE, "serve", "--data", demo.eval_data, "--targets",
                           f"{ONNX_CLASS},{TFLITE_CLASS}", "--drift-out", folder / "drift",
                           "--report-dir", folder / "reports"], log, env)
        try:
            with temporary_settings(updates=settings):
                kit.wait_for(lambda: len(kit.api_filter(api_url, "deployments")) == 3, 120,
                             "tiergate serve's deployments", proc=serve, log=log)
                kit.wait_for(lambda: kit.api_filter(api_url, "automations"), 30, "the revalidate trigger's automation")
                time.sleep(3)  # the server's trigger service loads the new automation
                yield SimpleNamespace(folder=folder, home=home, env=env, api_url=api_url, serve=serve, log=log,
                                      registry_url=f"sqlite:///{home / 'registry.db'}")
        finally:
            kit.stop(serve)


def _deployment(served, name: str) -> dict | None:
    return kit.api_get(served.api_url, f"deployments/name/{name}")


def _register(served, candidate: Path, reference: Path, *extra: str) -> dict:
    out = subprocess.run([kit.TIERGATE, "register", candidate, "--model", MODEL, "--reference", reference,
                          "--json", *extra], env=served.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["event"].startswith("sent"), record["event"]
    return record


def _triggered_run(served, sha: str, timeout_s: float = 300) -> dict:
    """The revalidate flow run the registration of `sha` triggered, once it is final."""
    deployment = _deployment(served, "tiergate-revalidate/on-register")

    def final():
        runs = kit.api_filter(served.api_url, "flow_runs", {"deployments": {"id": {"any_": [deployment["id"]]}}})
        mine = [r for r in runs if r["parameters"].get("artifact") == f"tiergate.artifact.{sha}"]
        return next((r for r in mine if kit.final(r)), None)

    return kit.wait_for(final, timeout_s, f"the revalidation triggered by {sha[:12]}", interval_s=2,
                        proc=served.serve, log=served.log)


def _registry(served):
    from tiergate.registry import Registry

    return Registry(served.registry_url)


def _engine_starts(since: datetime, image_ids: set[str]) -> int:
    """Container starts of these images on the machine's engine since `since` (Docker's own event log), but for
    those another process owns (its owner labels, execution/janitor.py): the other test worker's runs of the same
    demo models (the same content-hash images) start beside this one's."""
    import docker

    from tiergate.execution.janitor import OWNER_PID, owner_labels

    ours = owner_labels()[OWNER_PID]
    client = docker.from_env()
    try:
        events = client.events(since=since, until=datetime.now(timezone.utc), decode=True,
                               filters={"type": "container", "event": "start"})
        starts = []
        for event in events:
            attributes = event.get("Actor", {}).get("Attributes", {})
            if attributes.get("image") not in image_ids and event.get("from") not in image_ids:
                continue
            owner = attributes.get(OWNER_PID)
            if owner is None or owner == ours:          # ours, or of no known owner: counted
                starts.append(event)
        return len(starts)
    finally:
        client.close()


def _image_refs(folders) -> set[str]:
    from tiergate import results

    refs = set()
    for folder in folders:
        result = results.load(Path(folder))
        refs |= {result.image, result.image_id}
    return refs - {""}


@pytest.fixture(scope="module")
def registered_good(served, demo) -> tuple[dict, dict]:
    """The demo's good INT8 ONNX candidate, registered with `tiergate register`, and the run it triggered."""
    record = _register(served, demo.candidate("onnx-int8-entropy").path, demo.reference_onnx, "--tag", "step=1")
    return record, _triggered_run(served, record["sha256"])


def test_registered_artifact_triggers_revalidation_to_a_recorded_decision(served, registered_good):
    record, run = registered_good
    assert kit.completed(run), f"{run['state']}\n{kit.tail(served.log)}"
    with _registry(served) as registry:
        decisions = registry.decisions(artifact_sha=record["sha256"])
        runs = registry.runs(artifact_sha=record["sha256"])
    # the demo's good INT8 candidate: one image of 450 that FP32 gets right and it does not, so its accuracy
    # ratio's interval straddles 0.99: honestly INCONCLUSIVE (recorded, no alias moved)
    assert [d.verdict for d in decisions] == ["inconclusive"]
    assert {r.device_class for r in runs} == {ONNX_CLASS}          # only the class of its format
    assert all(r.status == "ok" and r.result_key for r in runs)
    artifacts = kit.api_filter(served.api_url, "artifacts", {"flow_runs": {"id": {"any_": [run["id"]]}}})
    assert {a["type"] for a in artifacts} >= {"markdown", "table"}   # the decision in the Prefect UI
    markdown = next(a for a in artifacts if a["type"] == "markdown")
    assert "INCONCLUSIVE" in markdown["data"] and ONNX_CLASS in markdown["data"]
    table = json.loads(next(a for a in artifacts if a["type"] == "table")["data"])
    assert {row["device class"] for row in table} == {ONNX_CLASS}
    assert {row["check"]: row["result"] for row in table if row["result"] != "pass"} == {
        "accuracy_ratio[probs]": "INCONCLUSIVE"}
    report = served.folder / "reports" / record["sha256"][:12]
    assert (report / "gate-summary.md").is_file() and (report / "junit.xml").is_file()


def test_unchanged_rerun_reuses_recorded_results_without_starting_a_container(served, demo, registered_good):
    from prefect.flows import load_flow_from_entrypoint

    from tiergate.registry import count_rows

    sha = registered_good[0]["sha256"]
    with _registry(served) as registry:
        before = count_rows(registry)
    revalidate = load_flow_from_entrypoint(str(kit.REPO / "flows" / "revalidate.py:revalidate"))
    started_at = datetime.now(timezone.utc)
    summary = revalidate(artifact=sha, data=str(demo.eval_data), targets=ONNX_CLASS,
                         registry_url=served.registry_url)
    run_folders = list((served.home / "runs").iterdir())
    assert summary["containers_started"] == 0
    assert summary["cache_hits"] == 2                       # candidate and FP32 reference on one class
    assert summary["reused_decision"] is True and summary["verdict"] == "INCONCLUSIVE"
    with _registry(served) as registry:
        assert count_rows(registry) == before                # nothing recorded twice
    # the engine's own event log: no container of these runs' images started during the re-run
    assert _engine_starts(started_at, _image_refs(run_folders)) == 0


def test_drift_report_flow_over_three_registered_artifacts(served, demo, registered_good):
    from prefect.deployments import run_deployment

    shas = [_register(served, demo.candidate(name).path, ref)["sha256"]
            for name, ref in (("onnx-int8-badcal", demo.reference_onnx), ("tflite-fp16", demo.reference_tflite))]
    runs = [_triggered_run(served, sha) for sha in shas]
    assert all(kit.completed(r) for r in runs), [r["state"] for r in runs]
    with _registry(served) as registry:
        verdicts = {sha: registry.decisions(artifact_sha=sha)[-1].verdict for sha in shas}
        gated = {a.sha256 for a in registry.artifacts(MODEL) if registry.decisions(artifact_sha=a.sha256)}
    assert verdicts == {shas[0]: "reject", shas[1]: "promote"}   # the broken calibration is caught
    assert len(gated) >= 3
    deployment = _deployment(served, "tiergate-drift-report/scheduled")
    assert [s["schedule"].get("cron") for s in deployment["schedules"]] == ["0 6 * * *"]
    flow_run = run_deployment("tiergate-drift-report/scheduled", timeout=240, poll_interval=2)
    assert flow_run.state.is_completed(), flow_run.state.message
    report = json.loads((served.folder / "drift" / MODEL / "report.json").read_text())
    reported = {row["artifact_sha"] for tier in report["tiers"].values() for row in tier["rows"]}
    assert gated <= reported
    assert set(report["tiers"]) == {"x86-server"}
    rows = {row["artifact_sha"]: row for row in report["tiers"]["x86-server"]["rows"]}
    assert rows[shas[0]]["decision"] == "reject" and rows[shas[1]]["decision"] == "promote"
    assert (served.folder / "drift" / MODEL / "report.html").stat().st_size > 1000


def test_release_gate_deployment_rejects_the_broken_candidate_with_junit_and_markdown(served, demo, tmp_path):
    """The CD gate as a served deployment: a REJECT fails the flow run (fail_on_reject), reports are written."""
    from prefect.deployments import run_deployment

    from tiergate.artifact import load_artifact

    badcal = demo.candidate("onnx-int8-badcal")
    with _registry(served) as registry:                # the registry records decisions of registered artifacts
        known = any(a.sha256 == load_artifact(badcal.path).sha256 for a in registry.artifacts(MODEL))
    if not known:          # not yet by the drift report's test: registered here, its revalidation waited for
        assert kit.completed(_triggered_run(served, _register(served, badcal.path, demo.reference_onnx)["sha256"]))
    out = tmp_path / "gate"
    flow_run = run_deployment("tiergate-gate/release-gate", timeout=300, poll_interval=2, parameters={
        "candidate": str(demo.candidate("onnx-int8-badcal").path), "reference": str(demo.reference_onnx),
        "data": str(demo.eval_data), "targets": ONNX_CLASS, "report_dir": str(out),
        "junit": str(out / "junit.xml"), "fail_on_reject": True})
    assert flow_run.state.is_failed() and "GateRejected" in flow_run.state.message, flow_run.state.message
    assert "REJECT" in flow_run.state.message
    decision = json.loads((out / "gate-decision.json").read_text())
    assert decision["verdict"] == "REJECT" and decision["reasons"]
    junit = (out / "junit.xml").read_text()
    assert "<failure" in junit and ONNX_CLASS in junit
    assert "REJECT" in (out / "gate-summary.md").read_text()


def test_worker_on_a_work_pool_runs_a_device_class(served, demo, registered_good, tmp_path):
    """A process worker of a work pool (as on a device host) runs the x86 class's runs; the gate gets them back."""
    from prefect.flows import load_flow_from_entrypoint

    from tiergate.orchestration.deployments import deploy_run_target

    deploy_run_target(POOL)
    log = tmp_path / "worker.log"
    worker = kit.start([kit.PREFECT, "worker", "start", "--pool", POOL, "--type", "process"], log, served.env)
    try:
        data = tmp_path / "subset.npz"   # new data: no recorded result to reuse, the worker must run containers
        with np.load(demo.eval_data) as npz:
            np.savez(data, **{k: npz[k][:200] for k in npz.files})
        sha = registered_good[0]["sha256"]
        revalidate = load_flow_from_entrypoint(str(kit.REPO / "flows" / "revalidate.py:revalidate"))
        summary = revalidate(artifact=sha, data=str(data), targets=ONNX_CLASS, registry_url=served.registry_url,
                             remote={ONNX_CLASS: POOL})
    finally:
        kit.stop(worker)
    assert summary["containers_started"] == 2 and summary["verdict"] == "INCONCLUSIVE"   # 200 images cannot resolve 0.99
    runs = kit.api_filter(served.api_url, "flow_runs", {"deployments": {"name": {"any_": [POOL]}}})
    assert len(runs) == 1 and all(kit.completed(r) for r in runs), [r["state"] for r in runs]   # one start
    assert {r["work_pool_name"] for r in runs} == {POOL}
    assert set(runs[0]["parameters"]["artifacts"]) == {"candidate", "reference"}
    assert runs[0]["parameters"]["samples"] is None                 # a native class: its samples on one worker
    assert all(r["id"] in kit.tail(log, 400) for r in runs)   # the worker process picked them up


ALT_CLASS = "x86-alt-engine"


@pytest.fixture
def second_engine(tmp_path):
    """A second dockerd (never the machine's own), holding the x86 base and runtime images, and a device
    class that runs on it."""
    import docker

    from tiergate.build import ensure_runtime_image
    from tiergate.targets import resolve

    engine = kit.SecondEngine(Path(f"/tmp/tg-dockerd-{os.getpid()}"))
    engine.folder.mkdir(exist_ok=True)
    engine.start()
    try:
        dc = resolve([ONNX_CLASS])[0]
        main = docker.from_env()
        runtime = ensure_runtime_image(dc, client=main)
        main.close()
        engine.load_from_machine_engine(dc.base_image, runtime.tag)
        targets = tmp_path / "targets"
        targets.mkdir()
        text = (kit.REPO / "targets" / f"{ONNX_CLASS}.toml").read_text()
        (targets / f"{ALT_CLASS}.toml").write_text(text.replace('docker_host = "local"',
                                                                f'docker_host = "{engine.host}"'))
        yield engine, targets
    finally:
        engine.stop()
        subprocess.run(["rm", "-rf", str(engine.folder)], check=False)


def test_engine_stopped_mid_run_fails_the_flow_and_records_nothing(served, demo, registered_good, second_engine,
                                                                   tmp_path, monkeypatch):
    import threading

    from prefect.flows import load_flow_from_entrypoint

    from tiergate.registry import count_rows

    engine, targets = second_engine
    monkeypatch.setenv("TIERGATE_TARGETS_DIR", str(targets))
    data = tmp_path / "large.npz"   # new data (no recorded result) and long enough to stop the engine mid-run
    with np.load(demo.eval_data) as npz:
        np.savez(data, **{k: np.concatenate([npz[k]] * 12) for k in npz.files})
    sha = registered_good[0]["sha256"]
    revalidate = load_flow_from_entrypoint(str(kit.REPO / "flows" / "revalidate.py:revalidate"))
    with _registry(served) as registry:
        before = count_rows(registry)
    stopped = threading.Event()

    def stop_when_running():
        client = engine.client()
        label = f"org.tiergate.device_class={ALT_CLASS}"
        kit.wait_for(lambda: client.containers.list(filters={"label": label, "status": "running"}), 300,
                     "a running target container on the second engine", interval_s=0.1)
        client.close()
        engine.stop()
        stopped.set()

    watcher = threading.Thread(target=stop_when_running, daemon=True)
    watcher.start()
    state = revalidate(artifact=sha, data=str(data), targets=ALT_CLASS, registry_url=served.registry_url,
                       return_state=True)
    watcher.join(60)
    assert stopped.is_set()
    assert state.is_failed()
    assert "InfrastructureFault" in state.message and f"on {ALT_CLASS}" in state.message, state.message
    assert "the engine is gone" in state.message and engine.host in state.message, state.message
    task_runs = kit.api_filter(served.api_url, "task_runs",
                               {"flow_runs": {"id": {"any_": [str(state.state_details.flow_run_id)]}}})
    runs = [t for t in task_runs if t["name"].startswith("run ")]
    assert len(runs) == 1 and runs[0]["run_count"] == 3     # one task for the tier; an engine fault is retried twice
    with _registry(served) as registry:
        assert count_rows(registry) == before               # no half-written decision, no stray run rows

    engine.start()                                          # the engine is back: the same flow completes
    summary = revalidate(artifact=sha, data=str(data), targets=ALT_CLASS, registry_url=served.registry_url)
    assert summary["verdict"] == "PROMOTE" and summary["containers_started"] == 2
    with _registry(served) as registry:
        after = count_rows(registry)
        decision = registry.decisions(artifact_sha=sha)[-1]
        recorded = {r.device_class for r in registry.runs(artifact_sha=sha) if r.id in decision.run_ids}
    assert after["decisions"] == before["decisions"] + 1 and decision.id == summary["decision_id"]
    assert recorded == {ALT_CLASS}


def test_prefect_yaml_deploys_with_prefects_own_cli(served, demo, tmp_path):
    """`prefect deploy --all` from the checkout creates every deployment in prefect.yaml and exits 0.

    Last in the module: its on-register trigger must not race the served one in earlier tests.
    """
    env = {**served.env, "TIERGATE_ROOT": str(kit.REPO), "TIERGATE_EVAL_DATA": str(demo.eval_data),
           "TIERGATE_REGISTRY_URL": served.registry_url, "TIERGATE_STORE": str(served.home / "store"),
           "TIERGATE_DRIFT_OUT": str(tmp_path / "drift"), "TIERGATE_MLFLOW_MODEL": "digits",
           "TIERGATE_MLFLOW_REFERENCE": "models:/digits@fp32"}
    for pool in ("tiergate", "arm64-farm"):
        subprocess.run([kit.PREFECT, "work-pool", "create", pool, "--type", "process"], env=env, cwd=kit.REPO,
                       capture_output=True, text=True, timeout=120, check=True)
    done = subprocess.run([kit.PREFECT, "--no-prompt", "deploy", "--all"], env=env, cwd=kit.REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    names = {d["name"] for d in kit.api_filter(served.api_url, "deployments")}
    assert {"on-register", "release-gate", "scheduled", "arm64-farm", "poll"} <= names
