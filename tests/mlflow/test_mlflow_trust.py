"""Issue 42 on the MLflow bridge: the release tools never vouch for the wrong model.

Two projects with the same relative `MLFLOW_TRACKING_URI=sqlite:///mlflow.db` and a model `digits` v1 each, one
home: each gate takes its own project's file (the download cache is keyed on the resolved store and the version's
own identity, not on the URI's text). A version deleted and registered again is fetched again. A quantized
reference is refused on every path, and so is --mlflow-promote of the reference's own alias. A failed write-back is
one line (MLflow's logger prints no traceback); a mistyped sqlite:/// URI creates nothing. The real CLI (in this
process), a real SQLite MLflow store, real Docker for the gates."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3

import numpy as np
import pytest

import mlflowkit
import modelkit
from tiergate.cli.main import main

X86 = "x86_64-cpu-onnxruntime"


def _client(folder):
    import logging

    from mlflow import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    return MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")


def _project(folder, template, files, alias=None):
    """A project folder with its own store (a copy of an empty, migrated one; used here by absolute URI) and
    `digits` v1 logged from `files`."""
    folder.mkdir(parents=True)
    shutil.copyfile(template, folder / "mlflow.db")
    client = _client(folder)
    experiment = client.create_experiment("p", artifact_location=(folder / "artifacts").as_uri())
    mlflowkit.log_version(client, experiment, "digits", *files, alias=alias)
    return client, experiment


@pytest.fixture(scope="module")
def projects(tmp_path_factory, mlflow_empty_store):
    root = tmp_path_factory.mktemp("mlflow-trust")
    rng = np.random.default_rng(4242)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(root / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    fp32 = modelkit.write(modelkit.linear(w, softmax=True), root / "fp32" / "model.onnx")
    good = modelkit.write(modelkit.linear(w + rng.normal(0, 1e-4, w.shape), softmax=True), root / "good" / "model.onnx")
    badcal = modelkit.write(modelkit.linear(w + rng.normal(0, 1.5, w.shape), softmax=True),
                            root / "badcal" / "model.onnx")
    (root / "int8").mkdir()
    int8 = modelkit.quantize_dynamic_int8(fp32, root / "int8" / "model.onnx")
    a = _project(root / "a", mlflow_empty_store, [good])
    b = _project(root / "b", mlflow_empty_store, [badcal])
    mlflowkit.log_version(a[0], a[1], "digits", int8, alias="champion")          # v2 of project a: INT8
    mlflowkit.log_version(a[0], a[1], "digits", fp32, alias="fp32")               # v3 of project a: FP32
    return {"root": root, "a": a, "b": b, "fp32": fp32, "good": good, "badcal": badcal, "int8": int8,
            "data": root / "eval.npz", "home": root / "home"}


def _in(projects, monkeypatch, project: str, uri: str = "sqlite:///mlflow.db"):
    monkeypatch.chdir(projects["root"] / project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    monkeypatch.setenv("TIERGATE_HOME", str(projects["home"]))


def _cli(capfd, *args):
    code = main(list(args))
    out, err = capfd.readouterr()
    return code, out, err


def _one_line(code, err, expected=2):
    lines = err.strip().splitlines()
    assert code == expected and len(lines) == 1 and lines[0].startswith("tiergate: error: "), (code, err[-3000:])
    assert "Traceback" not in err
    return lines[0]


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.docker
@pytest.mark.slow
def test_two_projects_with_one_relative_uri_each_gate_their_own_file(projects, monkeypatch, capfd):
    gate = ["gate", "-c", "models:/digits/1", "-r", str(projects["fp32"]), "-d", str(projects["data"]), "-t", X86,
            "--json", "--no-early-stop"]
    _in(projects, monkeypatch, "a")
    code, out, err = _cli(capfd, *gate)
    assert code == 0, err[-3000:]
    first = json.loads(out)
    _in(projects, monkeypatch, "b")                      # the same text names another store, another file
    code, out, err = _cli(capfd, *gate)
    second = json.loads(out)
    assert code == 1 and second["verdict"] == "REJECT", err[-3000:]
    assert second["lineage"]["candidate"]["mlflow"]["sha256"] == _sha(projects["badcal"])
    assert first["lineage"]["candidate"]["mlflow"]["sha256"] == _sha(projects["good"])
    assert first["lineage"]["candidate"]["mlflow"]["tracking_uri"].endswith(f"{projects['root']}/a/mlflow.db")
    assert projects["b"][0].get_model_version("digits", "1").tags["tiergate.verdict"] == "REJECT"
    assert projects["a"][0].get_model_version("digits", "1").tags["tiergate.verdict"] == "PROMOTE"

    # a write-back that fails (the store refuses the tag) is tiergate's one line: MLflow's logger prints nothing
    projects["b"][0].delete_model_version_tag("digits", "1", "tiergate.verdict")
    with sqlite3.connect(projects["root"] / "b" / "mlflow.db") as db:
        for event in ("INSERT", "UPDATE"):
            db.execute(f"CREATE TRIGGER refuse_{event} BEFORE {event} ON model_version_tags "
                       "BEGIN INSERT INTO no_such_table VALUES (1); END")
    try:
        code, out, err = _cli(capfd, *gate)
    finally:
        with sqlite3.connect(projects["root"] / "b" / "mlflow.db") as db:
            for event in ("INSERT", "UPDATE"):
                db.execute(f"DROP TRIGGER refuse_{event}")
    line = _one_line(code, err)
    assert "the decision is REJECT" in line and "MLflow was not updated" in line
    assert json.loads(out)["verdict"] == "REJECT"        # the decision was printed before


def test_a_version_deleted_and_registered_again_is_fetched_again(projects, monkeypatch, capfd, tmp_path):
    _in(projects, monkeypatch, "b")
    code, out, _ = _cli(capfd, "inspect", "models:/digits/1", "--json")
    assert code == 0 and json.loads(out)["artifact"]["sha256"] == _sha(projects["badcal"])
    client = projects["b"][0]
    client.delete_registered_model("digits")
    run = client.create_run(projects["b"][1])
    client.log_artifact(run.info.run_id, str(projects["good"]), "model")
    client.create_registered_model("digits")
    assert client.create_model_version("digits", source=f"{run.info.artifact_uri}/model",
                                       run_id=run.info.run_id).version == 1
    code, out, err = _cli(capfd, "inspect", "models:/digits/1", "--json")
    assert code == 0, err
    assert json.loads(out)["artifact"]["sha256"] == _sha(projects["good"])   # the new file, not the cached one


def test_a_quantized_reference_is_refused_on_every_path(projects, monkeypatch, capfd, tmp_path):
    _in(projects, monkeypatch, "a")
    base = ["-d", str(projects["data"]), "-t", X86]
    line = _one_line(*_cli(capfd, "gate", "-c", "models:/digits/1", "-r", "models:/digits@champion", *base)[::2])
    assert "models:/digits@champion (digits/2): the reference is quantized (int8)" in line
    line = _one_line(*_cli(capfd, "gate", "-c", str(projects["good"]), "-r", str(projects["int8"]), *base)[::2])
    assert f"{projects['int8']}: the reference is quantized" in line
    line = _one_line(*_cli(capfd, "explain", "-c", str(projects["int8"]), "-r", "models:/digits@champion", *base)[::2])
    assert "the reference is quantized" in line
    # the README's old flow: promoting onto the reference's own alias would make the INT8 model the next reference
    line = _one_line(*_cli(capfd, "gate", "-c", "models:/digits/1", "-r", "models:/digits@fp32", *base,
                           "--mlflow-promote", "fp32")[::2])
    assert "--mlflow-promote fp32: is the reference's own alias" in line
    assert projects["a"][0].get_model_version_by_alias("digits", "fp32").version == 3


def test_uris_that_name_nothing_create_nothing_and_say_one_line(projects, monkeypatch, capfd, tmp_path):
    for uri, made in (("sqlite:///mlfow.db", "mlfow.db"), ("sqlite:///nodir/mlflow.db", "nodir"),
                      ("./mlruns-typo", "mlruns-typo")):
        _in(projects, monkeypatch, "a", uri)
        monkeypatch.chdir(tmp_path)
        line = _one_line(*_cli(capfd, "gate", "-c", "models:/digits/1", "-r", str(projects["fp32"]), "-d",
                               str(projects["data"]), "-t", X86)[::2])
        assert "MLFLOW_TRACKING_URI" in line and "MLflow would create" in line
        assert not (tmp_path / made).exists() and not list(tmp_path.iterdir())
    _in(projects, monkeypatch, "a")
    for bad in ("models:/digits/²", "models:/digits/١"):
        line = _one_line(*_cli(capfd, "gate", "-c", bad, "-r", str(projects["fp32"]), "-d", str(projects["data"]),
                               "-t", X86)[::2])
        assert "models:/NAME/VERSION (a version number)" in line
    # inspect, explain and bisect take models:/ URIs as the gate does (fetched, then refused further on)
    for command in (["explain", "-c", "models:/digits/1", "-r", "models:/digits@fp32", "-d", str(projects["data"])],
                    ["bisect", "-c", "models:/digits/1", "-r", "models:/digits@fp32", "-d", str(projects["data"])]):
        line = _one_line(*_cli(capfd, *command, "-t", "no-such-class")[::2])
        assert "no-such-class" in line and "does not exist" not in line


def test_gc_removes_the_download_cache_and_keeps_the_watchers_state(projects, monkeypatch, capfd, tmp_path):
    home = tmp_path / "home"
    _in(projects, monkeypatch, "a")
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    assert _cli(capfd, "inspect", "models:/digits/1", "--json")[0] == 0
    from tiergate import mlflow_bridge

    mlflow_bridge.mark_seen("digits", "3")
    cached = [p for p in (home / "mlflow").iterdir() if p.is_dir()]
    assert len(cached) == 1
    code, out, err = _cli(capfd, "gc", "--json")
    assert code == 0, err
    removed = [i for i in json.loads(out)["items"] if i["kind"] == "mlflow"]
    assert [i["action"] for i in removed] == ["remove"] and not cached[0].exists()
    assert len(list((home / "mlflow").glob("watch-*.json"))) == 1


@pytest.mark.docker
@pytest.mark.slow
def test_an_onnx_model_logged_by_mlflow_keeps_its_runtime_graph(projects, monkeypatch, capfd, tmp_path):
    """mlflow.onnx.log_model writes the weights as external data: `inspect --target` described it (exit 2: "external
    data file ... does not exist next to the model") and the gate lost its runtime graph."""
    import mlflow
    import onnx

    rng = np.random.default_rng(4243)
    w = rng.normal(size=(64, 4))                        # 1 KiB and more: onnx writes it as external data
    x = rng.normal(size=(400, 64)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    fp32 = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "fp32.onnx")
    _in(projects, monkeypatch, "a")
    mlflow.set_tracking_uri(f"sqlite:///{projects['root'] / 'a' / 'mlflow.db'}")
    mlflow.set_experiment(experiment_id=projects["a"][1])
    with mlflow.start_run():
        info = mlflow.onnx.log_model(onnx.load(fp32), name="model", registered_model_name="ext",
                                     pip_requirements=["onnx"])          # no inference of the environment
    assert info.registered_model_version == 1
    code, out, err = _cli(capfd, "inspect", "models:/ext/1", "--target", X86, "--json")
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["artifact"]["external_data"] and report["runtime"][X86]["ok"]
    assert set(report["runtime"][X86]["levels"]) == {"basic", "extended", "all"}
    code, out, err = _cli(capfd, "gate", "-c", "models:/ext/1", "-r", str(fp32), "-d", str(tmp_path / "eval.npz"),
                          "-t", X86, "--json", "--no-early-stop")
    assert code == 0, err[-3000:]
    runtime = json.loads(out)["runtime"][X86]
    assert runtime["ok"] and runtime["ops"]["all"], runtime
