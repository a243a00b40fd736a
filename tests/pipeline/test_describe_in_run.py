"""A gate describes each tier's candidate in the candidate's own run (harness --describe): no describe container,
and the runtime graph at the level the run executes is the one the describer gives in a container of its own
(same op counts, fingerprint and placement). Real Docker, a tiny generated model on x86_64."""

from __future__ import annotations

import json

import numpy as np
import pytest

import modelkit
from tiergate import state
from tiergate.cli.main import main
from tiergate.execution.describe import describe_runtime
from tiergate.runtime_graph import DESCRIBE_FILE
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture
def models(tmp_path):
    rng = np.random.default_rng(2611)              # weights of this file's own: its images are its own
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + rng.normal(0, 1e-4, w.shape), softmax=True), tmp_path / "cand.onnx")
    return {"ref": ref, "cand": cand, "data": tmp_path / "eval.npz"}


@pytest.mark.docker
def test_the_candidate_run_describes_its_tier(models, tiergate_home, capsys):
    args = ["gate", "--candidate", str(models["cand"]), "--reference", str(models["ref"]), "--data",
            str(models["data"]), "--targets", X86, "--json"]
    assert main(args) == 0
    decision = json.loads(capsys.readouterr().out)
    graphs = tiergate_home / state.GRAPHS
    assert not graphs.exists() or not any(graphs.iterdir())            # no describe container ran
    described = [f for f in (tiergate_home / state.RUNS).glob("*/" + DESCRIBE_FILE)]
    assert len(described) == 1                                          # the candidate's run, not the reference's
    gate_graph = decision["runtime"][X86]
    assert gate_graph["ok"] and not gate_graph["cached"] and gate_graph["seconds"] > 0

    # the describer in a container of its own gives the same graph
    from tiergate.artifact import load_artifact

    dc = resolve(X86)[0]
    own = describe_runtime(load_artifact(models["cand"]), dc, gate_graph["image"]).to_json()
    for field in ("default_level", "providers", "machine", "versions"):
        assert gate_graph[field] == own[field], field
    level = own["default_level"]                           # a run describes the level it ran, the describer all
    assert set(own["levels"]) == {"basic", "extended", "all"} and list(gate_graph["levels"]) == [level]
    for field in ("levels", "ops", "fingerprints"):
        assert gate_graph[field] == {level: own[field][level]}, field

    # a re-run reads it from the cached run (the fast path is off: an entry of the quick cache removed)
    for entry in (tiergate_home / state.QUICK).glob("*.json"):
        entry.unlink()
    assert main(args) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["runtime"][X86]["cached"] and again["containers_started"] == 0
    assert {k: v for k, v in again["runtime"][X86].items() if k != "cached"} == \
        {k: v for k, v in gate_graph.items() if k != "cached"}
