"""`tiergate gate --attest` on a real gate (CLI subprocess, real Docker, the native x86_64 tier, a tiny classifier):
its attestation holds for an independent DSSE/in-toto check and for `tiergate verify`, every change is refused,
and the unchanged re-run (answered by the fast path) attests to the same statement.

One gate and its fast re-run, shared by the module (the suite's time budget)."""

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

import attestkit
import modelkit
import tiergate
from tiergate import state
from tiergate.cli.main import main
from tiergate.decision import Decision
from tiergate.policy import load_policy

pytestmark = pytest.mark.docker
X86 = "x86_64-cpu-onnxruntime"
SRC = str(Path(tiergate.__file__).resolve().parents[1])


def _tiergate(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TIERGATE_HOME=str(home), PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "tiergate.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """A PROMOTE gate with --attest (normal path, --json), then the same gate unchanged (the fast path)."""
    folder = tmp_path_factory.mktemp("attest-gate")
    rng = np.random.default_rng(2929)        # weights of this file's own: its images are its own
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(folder / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), folder / "ref.onnx")
    good = modelkit.write(modelkit.linear(w + rng.normal(0, 1e-4, w.shape), softmax=True), folder / "good.onnx")
    home = folder / "home"
    keygen = _tiergate(home, "keygen", str(folder / "signing"))
    assert keygen.returncode == 0, keygen.stderr
    gate = ["gate", "--candidate", str(good), "--reference", str(ref), "--data", str(folder / "eval.npz"),
            "--targets", X86, "--signing-key", str(folder / "signing")]
    first = _tiergate(home, *gate, "--attest", str(folder / "first.intoto.json"), "--json",
                      "--report-dir", str(folder / "report"))
    assert first.returncode == 0, first.stderr[-3000:]
    again = _tiergate(home, *gate, "--attest", str(folder / "again.intoto.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    return {"folder": folder, "good": good, "ref": ref, "pub": folder / "signing.pub", "key": folder / "signing",
            "first": folder / "first.intoto.json", "again": folder / "again.intoto.json",
            "decision": json.loads(first.stdout), "again_err": again.stderr, "again_out": again.stdout}


def _envelope(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_real_gates_attestation_holds_for_an_independent_verifier(gated):
    statement = attestkit.statement_of(_envelope(gated["first"]), gated["pub"].read_bytes())
    assert statement["subject"] == [{"name": "good.onnx",
                                     "digest": {"sha256": hashlib.sha256(gated["good"].read_bytes()).hexdigest()}}]
    assert statement["predicateType"].startswith("https://tiergate.dev/")
    predicate, decision = statement["predicate"], gated["decision"]
    assert predicate["verdict"] == decision["verdict"] == "PROMOTE"
    assert predicate["checks"] == decision["checks"] and {c["device_class"] for c in predicate["checks"]} == {X86}
    (tier,) = predicate["tiers"]
    assert tier["device_class"] == X86 and tier["machine"] == "x86_64" and tier["emulated"] is False
    assert tier["cpu"]["model"] and "sse2" in tier["cpu"]["features"]      # the CPU the runtime saw (harness)
    assert tier["runtime"] == "onnxruntime" and tier["runtime_versions"]["onnxruntime"]
    described = decision["runtime"][X86]["cpu"]          # the describe step saw the same CPU
    assert (tier["cpu"]["model"], tier["cpu"]["features"]) == (described["model"], described["features"])
    assert predicate["reference"]["digest"]["sha256"] == hashlib.sha256(gated["ref"].read_bytes()).hexdigest()
    assert predicate["policy"]["sha256"] == state.policy_identity(load_policy(None))
    # the decision's hash is gate-decision.json's, the file CD keeps (and MLflow's tiergate.decision_sha256)
    written = (gated["folder"] / "report" / "gate-decision.json").read_bytes()
    assert predicate["decision"]["sha256"] == hashlib.sha256(written).hexdigest()
    assert Decision.from_json(json.loads(written)).dumps() == Decision.from_json(decision).dumps()
    saved = json.loads((gated["folder"] / "home" / "decisions" / f"{predicate['decision']['key']}.json").read_text())
    assert saved["inputs"]["candidate"] == statement["subject"][0]["digest"]["sha256"]
    assert predicate["tiergate"]["version"] == tiergate.__version__


def test_the_fast_paths_attestation_is_the_first_ones(gated):
    assert "unchanged: the decision from the cache" in gated["again_err"]            # answered by cli/fastgate.py
    assert f"attestation: {gated['again']}" in gated["again_out"]
    pem = gated["pub"].read_bytes()
    first = attestkit.statement_of(_envelope(gated["first"]), pem)
    again = attestkit.statement_of(_envelope(gated["again"]), pem)
    assert again == first                   # subject and predicate alike (nothing time-dependent)
    assert gated["again"].read_bytes() == gated["first"].read_bytes()


def _verify(capsys, path: Path, key: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["verify", str(path), "--key", str(key), *(extra or ("--any-verdict",))])
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys, path: Path, key: Path, *extra: str) -> str:
    code, out, err = _verify(capsys, path, key, *extra)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and not out and "Traceback" not in err, (code, out, err)
    return lines[0]


def test_verify_accepts_the_gates_attestation_and_refuses_any_change(gated, capsys, tmp_path):
    proc = _tiergate(tmp_path / "home", "verify", str(gated["first"]), "--key", str(gated["pub"]),
                     "--candidate", str(gated["good"]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("verified: PROMOTE for good.onnx (sha256 "
                                  + hashlib.sha256(gated["good"].read_bytes()).hexdigest())
    envelope = _envelope(gated["first"])
    body = attestkit.payload(envelope)
    changed = tmp_path / "changed.json"
    positions = sorted({0, 1, len(body) // 7, len(body) // 3, len(body) // 2, len(body) - 2, len(body) - 1})
    for at in positions:
        data = bytearray(body)
        data[at] ^= 0x01
        changed.write_text(json.dumps(attestkit.with_payload(envelope, bytes(data))))
        assert "bad signature" in _refused(capsys, changed, gated["pub"]), at
    # the subject digest changed (the statement still JSON, still in-toto): refused
    statement = json.loads(body)
    digest = statement["subject"][0]["digest"]["sha256"]
    statement["subject"][0]["digest"]["sha256"] = hashlib.sha256(b"another model").hexdigest()
    changed.write_text(json.dumps(attestkit.with_payload(envelope, json.dumps(statement).encode())))
    assert "bad signature" in _refused(capsys, changed, gated["pub"])
    # a signature changed
    sig = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    sig[5] ^= 0x80
    changed.write_text(json.dumps({**envelope, "signatures": [{**envelope["signatures"][0],
                                                                "sig": base64.b64encode(bytes(sig)).decode()}]}))
    assert "bad signature" in _refused(capsys, changed, gated["pub"])
    # another key
    assert main(["keygen", str(tmp_path / "other")]) == 0
    capsys.readouterr()
    assert "not signed by this key" in _refused(capsys, gated["first"], tmp_path / "other.pub")
    # another candidate file (the FP32 reference): the signature holds, the subject is not that file
    line = _refused(capsys, gated["first"], gated["pub"], "--candidate", str(gated["ref"]))
    assert "subject digest differs" in line and digest in line
    # and the untouched envelope still verifies in-process (the refusals above were the changes)
    code, out, err = _verify(capsys, gated["first"], gated["pub"], "--candidate", str(gated["good"]))
    assert code == 0 and out.startswith("verified: PROMOTE"), err


def _fast_gate(gated, *extra: str) -> list[str]:
    """The module's gate again (unchanged: the fast path answers it, nothing runs), with other outputs."""
    return ["gate", "--candidate", str(gated["good"]), "--reference", str(gated["ref"]), "--data",
            str(gated["folder"] / "eval.npz"), "--targets", X86, "--signing-key", str(gated["key"]), *extra]


def test_the_attestation_is_written_whole_never_through_a_planted_link(gated, tmp_path, capsys, monkeypatch):
    """Issue 42: the temporary name was predictable (.NAME.part-PID) and written through a link planted there."""
    monkeypatch.setenv("TIERGATE_HOME", str(gated["folder"] / "home"))
    victim, dest = tmp_path / "victim", tmp_path / "out.intoto.json"
    victim.write_text("precious")
    (tmp_path / f".{dest.name}.part-{os.getpid()}").symlink_to(victim)
    dest.symlink_to(tmp_path / "elsewhere")                   # a link at the destination is replaced, not followed
    code = main(_fast_gate(gated, "--attest", str(dest)))
    capsys.readouterr()
    assert code == 0 and victim.read_text() == "precious" and not (tmp_path / "elsewhere").exists()
    assert not dest.is_symlink() and dest.read_bytes() == gated["first"].read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".{dest.name}.part-{os.getpid()}", dest.name,
                                                                "victim"])


@pytest.mark.root
def test_the_attestation_on_a_full_disk_is_one_line_and_leaves_nothing(gated, tmp_path, capsys, monkeypatch):
    from partskit import tiny_tmpfs

    mount = tiny_tmpfs(tmp_path / "tiny")
    try:
        with open(mount / "fill", "wb") as fh:
            try:
                fh.write(b"\0" * (1 << 20))
            except OSError:
                pass
        monkeypatch.setenv("TIERGATE_HOME", str(gated["folder"] / "home"))
        code = main(_fast_gate(gated, "--attest", str(mount / "a.intoto.json")))
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert code == 2 and "disk full" in lines[-1] and "Traceback" not in err, err
        assert [p.name for p in mount.iterdir()] == ["fill"]           # no .part file left
    finally:
        subprocess.run(["umount", str(mount)])
