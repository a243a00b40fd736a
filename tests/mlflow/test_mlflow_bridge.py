"""The MLflow bridge without Docker, against a real SQLite MLflow store: models:/ URIs, errors as one line (exit
2), the fetch cache, and the watcher's "versions newer than the last one seen"."""

from __future__ import annotations

import numpy as np
import pytest

import mlflowkit
import modelkit
from tiergate import mlflow_bridge as mb
from tiergate.cli.main import main
from tiergate.errors import InputError

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture(scope="module")
def mlstore(tmp_path_factory, mlflow_store):
    """The store's model `digits` for this module: v1 (FP32, alias champion), v2 (alias challenger)."""
    folder = tmp_path_factory.mktemp("mlflow-unit")
    rng = np.random.default_rng(2929)
    w = rng.normal(size=(4, 3))
    ref = modelkit.write(modelkit.linear(w, softmax=True), folder / "files" / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + 1e-4, softmax=True), folder / "files2" / "cand.onnx")
    np.savez(folder / "eval.npz", x=rng.normal(size=(16, 4)).astype(np.float32))
    client, experiment, _ = mlflow_store
    mlflowkit.log_version(client, experiment, "digits", ref, alias="champion")
    mlflowkit.log_version(client, experiment, "digits", cand, alias="challenger")
    return {"client": client, "experiment": experiment, "ref": ref, "cand": cand, "folder": folder,
            "data": folder / "eval.npz"}


def test_uris_parse_or_say_what_they_should_be():
    assert mb.parse_uri("models:/digits/3") == mb.ModelRef("digits", version="3")
    assert mb.parse_uri("models:/digits@champion") == mb.ModelRef("digits", alias="champion")
    assert mb.parse_uri("models:/team.digits-v2@fp_32").uri == "models:/team.digits-v2@fp_32"
    for bad in ("models:/digits", "models:/digits/latest", "models:/@x", "models:/digits@", "models:digits/1",
                "models:/digits@a b", "models://digits/1"):
        with pytest.raises(InputError, match="models:/NAME/VERSION"):
            mb.parse_uri(bad)
    for refused in ("latest", "v3", "a b"):
        with pytest.raises(InputError, match="--mlflow-promote"):
            mb.check_alias(refused)
    assert mb.check_alias("champion") == "champion"


def _one_line_error(capsys, args) -> str:
    code = main(["gate", *args])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiergate: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_unknown_alias_version_or_model_and_a_file_promoted_are_one_line(mlstore, tiergate_home, capsys):
    base = ["-d", str(mlstore["data"]), "-t", X86]
    line = _one_line_error(capsys, ["-c", "models:/digits@nope", "-r", "models:/digits/1", *base])
    assert "models:/digits@nope" in line and "alias nope not found" in line
    line = _one_line_error(capsys, ["-c", "models:/digits/9", "-r", "models:/digits/1", *base])
    assert "models:/digits/9" in line and "not found" in line
    line = _one_line_error(capsys, ["-c", "models:/nomodel@champion", "-r", str(mlstore["ref"]), *base])
    assert "nomodel" in line
    line = _one_line_error(capsys, ["-c", str(mlstore["cand"]), "-r", str(mlstore["ref"]), *base,
                                    "--mlflow-promote", "champion"])
    assert "--mlflow-promote needs an MLflow candidate" in line
    assert not (tiergate_home / "decisions").exists()          # nothing was gated


def test_an_unreachable_store_is_one_line_with_the_secret_masked(mlstore, tiergate_home, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:hunter2@127.0.0.1:9/?token=s3cr3t")
    line = _one_line_error(capsys, ["-c", "models:/digits/1", "-r", str(mlstore["ref"]), "-d",
                                    str(mlstore["data"]), "-t", X86])
    assert "hunter2" not in line and "s3cr3t" not in line and "MLflow" in line


def test_a_version_is_fetched_once_and_an_alias_resolved_every_time(mlstore, tiergate_home, monkeypatch):
    import mlflow.artifacts

    calls = []
    real = mlflow.artifacts.download_artifacts
    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", lambda **kw: calls.append(kw) or real(**kw))
    first = mb.fetch("models:/digits@challenger")
    assert (first.version, first.alias, first.path.name) == ("2", "challenger", "cand.onnx")
    assert first.path.read_bytes() == mlstore["cand"].read_bytes() and len(calls) == 1
    assert first.run_id and first.tracking_uri.startswith("sqlite:///")
    again = mb.fetch("models:/digits/2")                        # the same version: from the cache
    assert again.path == first.path and len(calls) == 1
    client = mlstore["client"]
    client.set_registered_model_alias("digits", "challenger", "1")
    try:
        moved = mb.fetch("models:/digits@challenger")           # the alias moved: resolved again, v1 fetched
    finally:
        client.set_registered_model_alias("digits", "challenger", "2")
    assert moved.version == "1" and moved.path.read_bytes() == mlstore["ref"].read_bytes() and len(calls) == 2
    first.path.write_bytes(b"edited")                           # a cache folder that no longer verifies
    assert mb.fetch("models:/digits/2").path.read_bytes() == mlstore["cand"].read_bytes() and len(calls) == 3


def test_a_version_with_no_model_file_or_several_is_refused(mlstore, tiergate_home, tmp_path):
    client, experiment = mlstore["client"], mlstore["experiment"]
    readme = tmp_path / "README.txt"
    readme.write_text("no model here")
    other = tmp_path / "other.tflite"
    other.write_bytes(b"x")
    none = mlflowkit.log_version(client, experiment, "empty", readme)
    several = mlflowkit.log_version(client, experiment, "several", mlstore["ref"], other)
    with pytest.raises(InputError, match="no .onnx or .tflite file"):
        mb.fetch(f"models:/empty/{none}")
    with pytest.raises(InputError, match="2 model files"):
        mb.fetch(f"models:/several/{several}")
    assert not list((tiergate_home / "mlflow").glob("*/"))   # nothing refused is cached


def test_the_watcher_triggers_each_new_version_once(mlstore, tiergate_home, tmp_path):
    from tiergate.orchestration.mlflow_watch import watch
    from tiergate.registry import Registry

    client, experiment = mlstore["client"], mlstore["experiment"]
    name = "watched"
    mlflowkit.log_version(client, experiment, name, mlstore["ref"], alias="fp32")
    assert mb.new_versions(name) == ["1"]
    sent = []

    def emit(record, reference):
        sent.append((record.sha256, reference.sha256))
        return "sent (id test)"

    url, store = f"sqlite:///{tmp_path / 'registry.db'}", str(tmp_path / "store")
    first = watch(name, f"models:/{name}@fp32", registry_url=url, store=store, emit=emit)
    assert [t.version for t in first] == ["1"] and len(sent) == 1
    assert mb.new_versions(name) == [] and watch(name, f"models:/{name}@fp32", registry_url=url, store=store,
                                                 emit=emit) == []
    v2 = mlflowkit.log_version(client, experiment, name, mlstore["cand"])
    v3 = mlflowkit.log_version(client, experiment, name, mlstore["cand"])
    assert mb.new_versions(name) == [v2, v3]

    def refused(record, reference):
        return "not sent (no Prefect API: set PREFECT_API_URL)"

    lost = watch(name, f"models:/{name}@fp32", registry_url=url, store=store, emit=refused)
    assert [(t.version, t.seen) for t in lost] == [(v2, False)]          # stopped at the first unsent event
    assert mb.new_versions(name) == [v2, v3]                              # tried again next time
    done = watch(name, str(mlstore["ref"]), registry_url=url, store=store, emit=emit)
    assert [t.version for t in done] == [v2, v3] and mb.new_versions(name) == []
    with Registry(url, store) as registry:
        record = registry.artifact(done[-1].sha256)
        assert record.model == name and record.tags["mlflow.name"] == name
        assert record.tags["mlflow.version"] == v3 and record.tags["mlflow.run_id"]
        assert record.reference_sha == sent[0][1]
    state = list((tiergate_home / "mlflow").glob("watch-*.json"))
    assert len(state) == 1 and '"last_version": 3' in state[0].read_text()
