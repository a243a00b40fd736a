"""`tiergate register` end to end: real models, real SQLite file, real store; bad input stores nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from registry_kit import make_onnx
from servekit import untraced

import modelkit as mk
from tiergate.cli.main import main
from tiergate.registry import Registry, count_rows
from tiergate.registry.store import file_sha256

TIERGATE = Path(sys.executable).with_name("tiergate")


@pytest.fixture
def env(tiergate_home, tmp_path, monkeypatch):
    for name in ("TIERGATE_REGISTRY_URL", "TIERGATE_STORE", "PREFECT_API_URL", "PREFECT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    return tiergate_home


@pytest.fixture
def models(tmp_path):
    fp32 = make_onnx(tmp_path / "models" / "fp32.onnx", seed=1)
    int8 = mk.quantize_dynamic_int8(fp32, tmp_path / "models" / "int8.onnx")
    return fp32, int8


def _nothing_stored(home: Path) -> bool:
    store = home / "store"
    if (home / "registry.db").exists():
        with Registry() as registry:
            assert count_rows(registry)["artifacts"] == 0
    return not store.exists() or not any(p.is_file() for p in store.rglob("*"))


def test_register_stores_and_records_with_reference(env, models, capsys):
    fp32, int8 = models
    code = main(["register", str(int8), "--model", "digits", "--reference", str(fp32), "--tag", "team=vision",
                 "--tag", "ticket=EDGE-7", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["precision"] == "int8" and out["tags"] == {"team": "vision", "ticket": "EDGE-7"}
    assert out["event"].startswith("not sent (no Prefect API")
    with Registry() as registry:
        record = registry.artifact(out["sha256"])
        reference = registry.artifact(out["reference_sha"])
        assert (record.model, record.reference_sha, record.format) == ("digits", reference.sha256, "onnx")
        assert reference.precision == "fp32" and set(record.fingerprint) >= {"structure", "weights", "quantization"}
        assert record.fingerprint["weights"] != reference.fingerprint["weights"]
        stored = env / "store" / record.store_key
        assert file_sha256(stored) == file_sha256(int8)
        assert sorted(a.sha256 for a in registry.artifacts("digits")) == sorted([record.sha256, reference.sha256])


def test_parent_and_config_are_recorded(env, models, tmp_path, capsys):
    fp32, int8 = models
    assert main(["register", str(fp32), "--model", "digits", "--reference", str(fp32), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    config = tmp_path / "quant.toml"
    config.write_text("per_channel = false\n")
    assert main(["register", str(int8), "--model", "digits", "--reference", str(fp32),
                 "--parent", first["sha256"][:10], "--config", str(config), "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    with Registry() as registry:
        child = registry.artifact(second["sha256"])
        assert child.parent_sha == first["sha256"] and child.config_sha == file_sha256(config)
        assert [a.sha256 for a in registry.lineage(child.sha256)] == [second["sha256"], first["sha256"]]
        assert count_rows(registry)["artifacts"] == 2


def test_external_data_model_is_stored_whole(env, tmp_path, capsys):
    big = make_onnx(tmp_path / "ext" / "model.onnx", seed=9, external="model.weights")
    assert main(["register", str(big), "--model", "ext-model", "--reference", str(big), "--json"]) == 0
    sha = json.loads(capsys.readouterr().out)["sha256"]
    with Registry() as registry:
        fetched = registry.fetch_artifact(sha, tmp_path / "fetched")
    x = {"x": np.ones((2, 4), np.float32)}
    run = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, x)[0] for p in (big, fetched)]
    np.testing.assert_array_equal(*run)


@pytest.mark.parametrize("case", ["text file", "model name", "dotdot name", "missing file", "unknown parent",
                                  "bad tag", "quantized reference", "reference not a model"])
def test_bad_input_exits_2_and_stores_nothing(env, models, tmp_path, capsys, case):
    fp32, int8 = models
    notes = tmp_path / "notes.onnx"
    notes.write_text("this is not a model\n")
    argv = {
        "text file": [str(notes), "--model", "digits", "--reference", str(fp32)],
        "model name": [str(int8), "--model", "team/digits", "--reference", str(fp32)],
        "dotdot name": [str(int8), "--model", "..", "--reference", str(fp32)],
        "missing file": [str(tmp_path / "nope.onnx"), "--model", "digits", "--reference", str(fp32)],
        "unknown parent": [str(int8), "--model", "digits", "--reference", str(fp32), "--parent", "abcdef12"],
        "bad tag": [str(int8), "--model", "digits", "--reference", str(fp32), "--tag", "novalue"],
        "quantized reference": [str(int8), "--model", "digits", "--reference", str(int8)],
        "reference not a model": [str(int8), "--model", "digits", "--reference", str(notes)],
    }[case]
    assert main(["register", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tiergate: error: ") and "Traceback" not in err[0]
    assert _nothing_stored(env)


def test_register_command_is_quiet_offline_and_never_imports_prefect(env, models, tmp_path):
    """No Prefect API: no event, no Prefect import (its import alone costs seconds), nothing on stderr."""
    fp32, int8 = models
    script = ("import sys; from tiergate.cli.main import main; code = main(sys.argv[1:]); "
              "assert 'prefect' not in sys.modules, 'prefect was imported'; sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "register", str(int8), "--model", "digits",
                           "--reference", str(fp32)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "registered " in done.stdout and "not sent (no Prefect API" in done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture
def prefect_server(tmp_path):
    """A real Prefect server on 127.0.0.1 (its own PREFECT_HOME), stopped by PID afterwards."""
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-server"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = open(tmp_path / "prefect-server.log", "w")
    proc = subprocess.Popen([str(TIERGATE.with_name("prefect")), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=untraced(env))
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while not _health(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prefect server did not start: {(tmp_path / 'prefect-server.log').read_text()[-500:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


def _events(url: str, name: str) -> list[dict]:
    body = json.dumps({"filter": {"event": {"name": [name]}}, "limit": 10}).encode()
    request = urllib.request.Request(f"{url}/events/filter", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())["events"]


@pytest.mark.prefect
@pytest.mark.slow
def test_register_emits_the_event_to_a_prefect_server(env, models, prefect_server, tmp_path):
    fp32, int8 = models
    done = subprocess.run([str(TIERGATE), "register", str(int8), "--model", "digits", "--reference", str(fp32),
                           "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PREFECT_API_URL": prefect_server})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["event"].startswith("sent")
    deadline = time.monotonic() + 30
    while not (events := _events(prefect_server, "tiergate.artifact.registered")) and time.monotonic() < deadline:
        time.sleep(1)
    assert len(events) == 1
    resource = events[0]["resource"]
    assert resource["prefect.resource.id"] == f"tiergate.artifact.{out['sha256']}"
    assert resource["tiergate.model"] == "digits" and resource["tiergate.precision"] == "int8"
    assert events[0]["payload"]["reference_sha"] == out["reference_sha"]
