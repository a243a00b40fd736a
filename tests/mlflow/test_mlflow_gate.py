"""Issue 29's "done means" for MLflow: `tiergate gate -c models:/digits@challenger -r models:/digits@fp32
--mlflow-promote champion` (the FP32 reference under an alias of its own: issue 42) through the real CLI (a
subprocess), real Docker on the native x86 tier, a real
SQLite MLflow store. A PROMOTE tags the version and moves the alias; a REJECT leaves the alias and carries the
failing checks as tags (and, with --registry, the MLflow identity in the tiergate registry's artifact tags)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mlflowkit
import modelkit
import tiergate

X86 = "x86_64-cpu-onnxruntime"
SRC = str(Path(tiergate.__file__).resolve().parents[1])
NAME = "gated-digits"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, mlflow_store):
    """FP32 v1 (fp32), a good candidate v2 (challenger), a broken one v3; 400 labelled samples."""
    folder = tmp_path_factory.mktemp("mlflow-gate")
    rng = np.random.default_rng(2930)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(folder / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    files = {}
    for name, weights in (("fp32", w), ("good", w + rng.normal(0, 1e-4, w.shape)),
                          ("broken", w + rng.normal(0, 1.5, w.shape))):
        files[name] = modelkit.write(modelkit.linear(weights, softmax=True), folder / name / "model.onnx")
    client, experiment, uri = mlflow_store
    versions = {"fp32": mlflowkit.log_version(client, experiment, NAME, files["fp32"], alias="fp32"),
                "good": mlflowkit.log_version(client, experiment, NAME, files["good"], alias="challenger"),
                "broken": mlflowkit.log_version(client, experiment, NAME, files["broken"])}
    return {"client": client, "uri": uri, "versions": versions, "data": folder / "eval.npz", "folder": folder,
            "home": folder / "home"}


def _gate(setup, *args):
    env = dict(os.environ, TIERGATE_HOME=str(setup["home"]), MLFLOW_TRACKING_URI=setup["uri"],
               PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "tiergate.cli.main", "gate", "-d", str(setup["data"]), "-t", X86,
                           "--json", *args], env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.docker
@pytest.mark.slow
def test_promote_moves_the_alias_and_reject_leaves_it_with_the_failing_checks_as_tags(setup):
    client, versions = setup["client"], setup["versions"]
    report, key = setup["folder"] / "report", setup["folder"] / "signing"
    from tiergate.attest import generate

    generate(key)
    code, out, err = _gate(setup, "-c", f"models:/{NAME}@challenger", "-r", f"models:/{NAME}@fp32",
                           "--mlflow-promote", "champion", "--report-dir", str(report),
                           "--attest", str(setup["folder"] / "attest.json"), "--signing-key", str(key))
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    assert doc["verdict"] == "PROMOTE"
    lineage = doc["lineage"]["candidate"]["mlflow"]
    assert (lineage["name"], lineage["version"], lineage["alias"]) == (NAME, versions["good"], "challenger")
    assert lineage["run_id"] and lineage["tracking_uri"] == setup["uri"]
    assert doc["lineage"]["reference"]["mlflow"]["version"] == versions["fp32"]
    written = (report / "gate-decision.json").read_bytes()
    assert json.loads(written)["lineage"] == doc["lineage"]
    assert client.get_model_version_by_alias(NAME, "champion").version == int(versions["good"])
    tags = client.get_model_version(NAME, versions["good"]).tags
    assert tags["tiergate.verdict"] == "PROMOTE"
    assert tags["tiergate.decision_sha256"] == hashlib.sha256(written).hexdigest()
    # the signed attestation names the same decision (gate-decision.json's hash) and carries the lineage
    predicate = json.loads(base64.b64decode(json.loads((setup["folder"] / "attest.json").read_text())["payload"]))[
        "predicate"]
    assert predicate["decision"]["sha256"] == tags["tiergate.decision_sha256"]
    assert predicate["lineage"] == doc["lineage"]
    assert tags["tiergate.report"] == str((report / "gate-summary.md").resolve())
    assert not [k for k in tags if k.startswith(f"tiergate.{X86}.")]
    assert f"moved alias champion to {NAME}/{versions['good']}" in err

    # the broken candidate, against the FP32 version by number (champion now names the good one)
    registry = f"sqlite:///{setup['folder'] / 'registry.db'}"
    code, out, err = _gate(setup, "-c", f"models:/{NAME}/{versions['broken']}", "-r", f"models:/{NAME}/{versions['fp32']}",
                           "--mlflow-promote", "champion", "--registry", registry, "--explain")
    assert code == 1, err[-3000:]
    doc = json.loads(out)
    assert doc["verdict"] == "REJECT" and "lineage" in doc
    assert doc["cache_hits"] >= 1                               # the FP32 run reused from the first gate
    assert client.get_model_version_by_alias(NAME, "champion").version == int(versions["good"])   # not moved
    tags = client.get_model_version(NAME, versions["broken"]).tags
    failed = {f"tiergate.{c['device_class']}.{c['name']}" + (f".{c['output']}" if c["output"] else "")
              for c in doc["checks"] if not c["passed"]}
    assert f"tiergate.{X86}.accuracy_ratio.y" in failed            # per-output checks name their output
    assert tags["tiergate.verdict"] == "REJECT"
    assert {k for k in tags if k.startswith(f"tiergate.{X86}.")} == failed
    assert all(0 < len(tags[k]) <= 500 for k in failed)
    assert "accuracy_ratio[y]" in tags[f"tiergate.{X86}.accuracy_ratio.y"]
    assert "tiergate.report" not in tags                        # no --report-dir: no link
    assert "alias champion not moved (REJECT)" in err
    from tiergate.registry import Registry

    with Registry(registry, str(setup["folder"] / "store")) as reg:
        record = reg.artifacts(NAME)[-1]
        assert record.tags["mlflow.version"] == versions["broken"] and record.tags["mlflow.name"] == NAME
        recorded = reg.decisions(artifact_sha=record.sha256)[-1]
        assert recorded.verdict.upper() == "REJECT"
        # gate --explain --registry: the explanation is recorded against that decision (the report links it)
        explained = reg.explanations([recorded.id])[recorded.id]
        printed = doc["explain"]["targets"][X86]
        assert printed["first_divergent"] and explained["targets"][X86]["first_divergent"] == printed["first_divergent"]
        assert explained["candidate"] == doc["explain"]["candidate"]
