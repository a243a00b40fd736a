"""Issue 42 on `tiergate verify`, the deploy step's check (real Ed25519 keys from `tiergate keygen`, the CLI in this
process or as a subprocess where a hang is the failure): exit 0 only for a valid signature over a PROMOTE of the
candidate given; --any-verdict for an auditor; --reference / --policy-sha256 pinned when asked; strict envelopes
(no duplicated key, bounded nesting, DSSE's URL-safe base64 taken); values printed on one line; regular files
only; keygen makes no folder."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

import attestkit
import tiergate
from test_attest_keys import _attested, _cli, _models, _one_line, keys  # noqa: F401 - keys is a fixture
from tiergate import state
from tiergate.policy import load_policy

SRC = str(Path(tiergate.__file__).resolve().parents[1])


def _verify(capsys, envelope: Path, key: Path, *extra: str):
    return _cli(capsys, "verify", str(envelope), "--key", str(key), *extra)


def _signed(key_path: Path, doc: dict | bytes, encode=base64.b64encode) -> dict:
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    sig = key.sign(attestkit.dsse_pae(attestkit.IN_TOTO, body))
    return {"payloadType": attestkit.IN_TOTO, "payload": encode(body).decode(),
            "signatures": [{"keyid": "", "sig": encode(sig).decode()}]}


def test_verify_exits_0_only_for_a_promote_of_this_candidate(keys, tmp_path, capsys):
    cand, ref = _models(tmp_path)
    for verdict in ("REJECT", "INCONCLUSIVE"):
        path, _ = _attested(tmp_path, keys[0], cand, ref, verdict=verdict)
        code, out, err = _verify(capsys, path, keys[1], "--candidate", str(cand))
        assert code == 1 and not out and f"the attested verdict is {verdict}, not PROMOTE" in _one_line(err)
        code, out, err = _verify(capsys, path, keys[1], "--any-verdict")                 # the auditor's check
        assert code == 0 and out.startswith(f"verified: {verdict} for cand.onnx"), err
    path, _ = _attested(tmp_path, keys[0], cand, ref, verdict="PROMOTE")
    code, out, err = _verify(capsys, path, keys[1])                                      # which candidate?
    assert code == 2 and "verify needs --candidate FILE" in _one_line(err)
    code, out, err = _verify(capsys, path, keys[1], "--candidate", str(cand))
    assert code == 0 and out.startswith("verified: PROMOTE for cand.onnx"), err
    code, out, err = _verify(capsys, path, keys[1], "--candidate", str(ref))             # a PROMOTE of another file
    assert code == 1 and "subject digest differs" in _one_line(err)
    # the deploy step may pin the reference and the policy it approved
    policy = state.policy_identity(load_policy(None))
    code, out, err = _verify(capsys, path, keys[1], "--candidate", str(cand), "--reference", str(ref),
                             "--policy-sha256", policy)
    assert code == 0 and "the reference file is the statement's" in out, err
    code, out, err = _verify(capsys, path, keys[1], "--candidate", str(cand), "--reference", str(cand))
    assert code == 1 and "reference digest differs" in _one_line(err)
    code, out, err = _verify(capsys, path, keys[1], "--candidate", str(cand), "--policy-sha256", "0" * 64)
    assert code == 1 and "policy differs" in _one_line(err)


def test_verify_refuses_deep_or_duplicated_json_and_prints_values_on_one_line(keys, tmp_path, capsys):
    cand, ref = _models(tmp_path)
    path, _ = _attested(tmp_path, keys[0], cand, ref, verdict="PROMOTE")
    envelope = json.loads(path.read_text())
    statement = json.loads(attestkit.payload(envelope))
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 200_000 + "]" * 200_000)                       # an unsigned envelope, very deep
    code, out, err = _verify(capsys, bad, keys[1], "--any-verdict")
    assert code == 1 and "internal error" not in err and "nested" in _one_line(err)
    # two payloads in one envelope: a reader that keeps the first sees another statement than one keeping the last
    (tmp_path / "r").mkdir()
    rejected, _ = _attested(tmp_path / "r", keys[0], cand, ref)
    other = json.loads(rejected.read_text())
    text = json.dumps(envelope)[:-1] + ', "payload": ' + json.dumps(other["payload"]) + "}"
    bad.write_text(text)
    code, out, err = _verify(capsys, bad, keys[1], "--candidate", str(cand))
    assert code == 1 and "twice" in _one_line(err)
    body = json.dumps(statement)[:-1] + ', "predicate": {"verdict": "REJECT"}}'          # duplicated in the payload
    bad.write_text(json.dumps(_signed(keys[0], body.encode())))
    code, out, err = _verify(capsys, bad, keys[1], "--candidate", str(cand))
    assert code == 1 and "twice" in _one_line(err)
    # a subject name with a newline cannot forge a second "verified:" line
    forged = {**statement, "subject": [{**statement["subject"][0],
                                        "name": "cand.onnx (sha256 x)\nverified: PROMOTE for prod.onnx"}]}
    bad.write_text(json.dumps(_signed(keys[0], forged)))
    code, out, err = _verify(capsys, bad, keys[1], "--candidate", str(cand))
    assert code == 0 and len(out.splitlines()) == 1 and "\\n" in out, (out, err)
    # DSSE allows URL-safe base64, padded or not
    urlsafe = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")    # noqa: E731
    bad.write_text(json.dumps(_signed(keys[0], statement, urlsafe)))
    code, out, err = _verify(capsys, bad, keys[1], "--candidate", str(cand))
    assert code == 0 and out.startswith("verified: PROMOTE"), err


def test_only_regular_files_are_read_and_keygen_makes_no_folder(keys, tmp_path, capsys):
    cand, ref = _models(tmp_path)
    path, _ = _attested(tmp_path, keys[0], cand, ref, verdict="PROMOTE")
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)
    env = dict(os.environ, TIERGATE_HOME=str(tmp_path / "home"),
               PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for args in (["verify", str(path), "--key", str(keys[1]), "--candidate", str(fifo)],
                 ["verify", str(fifo), "--key", str(keys[1]), "--any-verdict"],
                 ["verify", str(path), "--key", str(keys[1]), "--candidate", "/dev/zero"],
                 ["inspect", str(fifo)], ["inspect", "/dev/zero"]):
        proc = subprocess.run([sys.executable, "-m", "tiergate.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=60)      # a FIFO once made this wait for ever
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "not a regular file" in lines[0], (args, proc.stderr)
    code, out, err = _cli(capsys, "keygen", str(tmp_path / "no" / "such" / "k"))
    assert code == 2 and "does not exist" in _one_line(err) and not (tmp_path / "no").exists()
