"""Issue 42: a saved run is believed only when this machine's key sealed it, for its own run key, with exactly its
files. A home from an untrusted place cannot make a gate PROMOTE: the candidate's run edited to hold the reference's
outputs (hash fixed, decisions removed), or the reference's whole sealed folder copied over the candidate's, is run
again, and the REJECT stands. The real CLI (in this process), real Docker on the native x86 tier."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

import modelkit
from tiergate.cli.main import main

X86 = "x86_64-cpu-onnxruntime"


def _gate(capsys, args) -> tuple[int, dict, str]:
    code = main(["gate", *args, "--json", "--no-early-stop"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def _runs(home) -> dict[str, str]:
    """role -> run folder name, from the one saved decision's inputs."""
    (decision,) = (home / "decisions").glob("*.json")
    runs = json.loads(decision.read_text())["inputs"]["runs"]
    return {label.split("/")[0]: value.split(":")[0] for label, value in runs.items()}


@pytest.mark.docker
def test_a_forged_run_is_run_again_never_believed(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(4204)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "ref.onnx")
    bad = modelkit.write(modelkit.linear(w + rng.normal(0, 1.5, w.shape), softmax=True), tmp_path / "bad.onnx")
    home = tmp_path / "home"
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    args = ["-c", str(bad), "-r", str(ref), "-d", str(tmp_path / "eval.npz"), "-t", X86]
    key = tmp_path / "config" / "cache.key"
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(key))
    code, first, err = _gate(capsys, args)
    assert code == 1 and first["verdict"] == "REJECT", err[-3000:]
    runs = _runs(home)

    candidate, reference = home / "runs" / runs["candidate"], home / "runs" / runs["reference"]

    # 1. the candidate's run made to hold the reference's outputs, its hash fixed, the decisions gone
    shutil.copyfile(reference / "outputs.npz", candidate / "outputs.npz")
    doc = json.loads((candidate / "result.json").read_text())
    doc["outputs_sha256"] = hashlib.sha256((candidate / "outputs.npz").read_bytes()).hexdigest()
    (candidate / "result.json").write_text(json.dumps(doc, indent=1))
    shutil.rmtree(home / "decisions")
    shutil.rmtree(home / "quick", ignore_errors=True)
    code, again, err = _gate(capsys, args)
    assert code == 1 and again["verdict"] == "REJECT", err[-3000:]
    assert f"discarding the saved run {runs['candidate']}" in err and again["cache_hits"] == 1   # the reference's

    # 2. the reference's whole folder (its own valid seal) copied over the candidate's run key
    shutil.rmtree(candidate)
    shutil.copytree(reference, candidate)
    shutil.rmtree(home / "decisions")
    shutil.rmtree(home / "quick", ignore_errors=True)
    code, third, err = _gate(capsys, args)
    assert code == 1 and third["verdict"] == "REJECT", err[-3000:]
    assert f"discarding the saved run {runs['candidate']}" in err
    assert third["checks"] == first["checks"]

    # 3. a sealed file holding NaN is discarded (was: internal error), through the fast path and the normal one
    for sealed in [*(home / "quick").glob("*.json"), *(home / "decisions").glob("*.json")]:
        sealed.write_text(sealed.read_text()[:-2] + ', "x": NaN}')
    code, again, err = _gate(capsys, args)
    assert code == 1 and again["verdict"] == "REJECT" and "internal error" not in err, err[-3000:]
    # a seal key others may read is not used (nor one behind a link): the gate still decides, nothing is believed
    key.chmod(0o644)
    code, again, err = _gate(capsys, args)
    assert code == 1 and "its mode is 0644" in err and again["cache_hits"] == 0, err[-3000:]
    key.chmod(0o600)
    (tmp_path / "link.key").symlink_to(key)
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(tmp_path / "link.key"))
    code, again, err = _gate(capsys, args)
    assert code == 1 and "symbolic link" in err and again["cache_hits"] == 0, err[-3000:]
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(key))
