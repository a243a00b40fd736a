"""Signed decisions without Docker: keygen, the envelope of a decision built here (held against an independent
DSSE check), the candidate's content hash (ONNX external data), and every unusable input as exit 2, one line."""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

import attestkit
import modelkit
from tiergate import attest
from tiergate.artifact import load_artifact
from tiergate.cli.main import main
from tiergate.decision import Check, Decision, GateRun
from tiergate.policy import load_policy
from tiergate.request import GateRequest
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def keys(tmp_path, capsys):
    code, out, err = _cli(capsys, "keygen", str(tmp_path / "signing"))
    assert code == 0, err
    return tmp_path / "signing", tmp_path / "signing.pub"


def _models(folder):
    rng = np.random.default_rng(29)
    w = rng.normal(size=(4, 3))
    cand = modelkit.write(modelkit.linear(w + 1e-4, softmax=True), folder / "cand.onnx")
    ref = modelkit.write(modelkit.linear(w, softmax=True), folder / "ref.onnx")
    return cand, ref


def _attested(folder, key_path, candidate, reference, verdict="REJECT") -> tuple:
    """An attestation of a decision built here (no gate run): (its path, the decision)."""
    checks = [Check(X86, "x86-server", "accuracy_ratio", 0.9, 0.99, ">=", False),
              Check(X86, "x86-server", "sqnr_db", math.inf, 20.0, ">=", True, output="probs")]
    decision = Decision(verdict, checks, {}, {}, [], False, ["builtin:default-policy.toml"])
    hashes = {"candidate": load_artifact(candidate).sha256, "reference": load_artifact(reference).sha256}
    run = GateRun(decision, decision_key="0" * 32, hashes=hashes)
    request = GateRequest(candidate, reference, "eval.npz", tuple(resolve(X86)), load_policy(None))
    path = folder / "decision.intoto.json"
    attest.Attestation(path, attest.load_private_key(key_path), request).write(run)
    return path, decision


def test_keygen_writes_an_ed25519_pair_with_private_modes_and_never_overwrites(keys, tmp_path, capsys):
    private, public = keys
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(public).st_mode) & 0o077 in (0o044, 0o004, 0o040, 0)   # readable, never writable
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")          # PKCS8
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")            # SubjectPublicKeyInfo
    key = serialization.load_pem_private_key(private.read_bytes(), password=None)
    pub = serialization.load_pem_public_key(public.read_bytes())
    assert isinstance(key, Ed25519PrivateKey) and isinstance(pub, Ed25519PublicKey)
    assert key.public_key().public_bytes_raw() == pub.public_bytes_raw()
    before = (private.read_bytes(), public.read_bytes())
    code, out, err = _cli(capsys, "keygen", str(private))
    assert code == 2 and "already exists" in _one_line(err)
    assert (private.read_bytes(), public.read_bytes()) == before
    (tmp_path / "lone.pub").write_text("someone's key")            # a PATH.pub in the way is refused too
    code, out, err = _cli(capsys, "keygen", str(tmp_path / "lone"))
    assert code == 2 and "lone.pub" in _one_line(err) and not (tmp_path / "lone").exists()
    assert (tmp_path / "lone.pub").read_text() == "someone's key"
    code, out, err = _cli(capsys, "keygen", str(tmp_path))          # a folder is no key file
    assert code == 2 and _one_line(err)


def test_the_envelope_holds_for_an_independent_verifier(keys, tmp_path, capsys):
    cand, ref = _models(tmp_path)
    path, decision = _attested(tmp_path, keys[0], cand, ref)
    envelope = json.loads(path.read_text())
    statement = attestkit.statement_of(envelope, keys[1].read_bytes())
    assert statement["subject"] == [{"name": "cand.onnx", "digest": {"sha256": hashlib.sha256(cand.read_bytes())
                                                                     .hexdigest()}}]
    assert statement["predicateType"] == attest.PREDICATE_TYPE
    predicate = statement["predicate"]
    assert predicate["verdict"] == "REJECT"
    assert [(c["name"], c["passed"], c["value"], c["threshold"]) for c in predicate["checks"]] == \
        [("accuracy_ratio", False, 0.9, 0.99), ("sqnr_db", True, "inf", 20.0)]
    assert predicate["reference"]["digest"]["sha256"] == hashlib.sha256(ref.read_bytes()).hexdigest()
    assert predicate["decision"]["sha256"] == hashlib.sha256((decision.dumps() + "\n").encode()).hexdigest()
    assert [t["device_class"] for t in predicate["tiers"]] == [X86]
    # nothing time-dependent: the same decision attests to the same bytes (Ed25519 signatures are deterministic)
    first = path.read_bytes()
    _attested(tmp_path, keys[0], cand, ref)
    assert path.read_bytes() == first
    code, out, err = _cli(capsys, "verify", str(path), "--key", str(keys[1]), "--candidate", str(cand))
    assert code == 1 and "the attested verdict is REJECT, not PROMOTE" in _one_line(err) and not out  # issue 42
    code, out, err = _cli(capsys, "verify", str(path), "--key", str(keys[1]), "--candidate", str(cand),
                          "--any-verdict")                                                       # an auditor
    assert code == 0, err
    assert out.startswith("verified: REJECT for cand.onnx")
    # another verdict, another payload: the envelope is about this decision
    other, _ = _attested(tmp_path, keys[0], cand, ref, verdict="PROMOTE")
    assert json.loads(other.read_text())["payload"] != envelope["payload"]


def test_the_subject_is_intakes_hash_external_data_included(keys, tmp_path, capsys):
    folder = tmp_path / "ext"
    folder.mkdir()
    cand = modelkit.write(modelkit.mlp(seed=5), folder / "cand.onnx", external="cand.bin")
    ref = modelkit.write(modelkit.mlp(seed=6), folder / "ref.onnx")
    path, _ = _attested(tmp_path, keys[0], cand, ref, verdict="PROMOTE")
    statement = attestkit.statement_of(json.loads(path.read_text()), keys[1].read_bytes())
    digest = statement["subject"][0]["digest"]["sha256"]
    assert digest == load_artifact(cand).sha256 != hashlib.sha256(cand.read_bytes()).hexdigest()
    code, out, err = _cli(capsys, "verify", str(path), "--key", str(keys[1]), "--candidate", str(cand))
    assert code == 0, err
    data = bytearray((folder / "cand.bin").read_bytes())
    data[-1] ^= 0x01                                     # the weights change, the model file does not
    (folder / "cand.bin").write_bytes(bytes(data))
    code, out, err = _cli(capsys, "verify", str(path), "--key", str(keys[1]), "--candidate", str(cand))
    assert code == 1 and "subject digest differs" in _one_line(err)


def test_verify_refuses_what_is_not_a_tiergate_dsse_statement(keys, tmp_path, capsys):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey as Key

    cand, ref = _models(tmp_path)
    path, _ = _attested(tmp_path, keys[0], cand, ref)
    envelope = json.loads(path.read_text())
    key = serialization.load_pem_private_key(keys[0].read_bytes(), password=None)
    statement = json.loads(attestkit.payload(envelope))

    def signed(doc: dict, payload_type: str = attestkit.IN_TOTO) -> dict:
        import base64

        body = json.dumps(doc).encode()
        sig = key.sign(attestkit.dsse_pae(payload_type, body))
        return {"payloadType": payload_type, "payload": base64.b64encode(body).decode(),
                "signatures": [{"keyid": "", "sig": base64.b64encode(sig).decode()}]}

    cases = {
        "not JSON": b"\x00not json",
        "a JSON list": b"[]",
        "no signatures": json.dumps({**envelope, "signatures": []}).encode(),
        "payload not base64": json.dumps({**envelope, "payload": "***"}).encode(),
        "another payloadType": json.dumps(signed(statement, "application/json")).encode(),
        "another statement type": json.dumps(signed({**statement, "_type": "https://in-toto.io/Statement/v0.1"})).encode(),
        "another predicate type": json.dumps(signed({**statement, "predicateType": "https://slsa.dev/provenance/v1"}))
        .encode(),
        "no subject": json.dumps(signed({**statement, "subject": []})).encode(),
    }
    for what, data in cases.items():
        bad = tmp_path / "bad.json"
        bad.write_bytes(data)
        code, out, err = _cli(capsys, "verify", str(bad), "--key", str(keys[1]), "--any-verdict")
        assert code == 1 and _one_line(err).startswith("tiergate: error: ") and not out, (what, err)
    # the statement re-signed well by this key verifies: the refusals above are about their one change
    good = tmp_path / "resigned.json"
    good.write_text(json.dumps(signed(statement)))
    assert _cli(capsys, "verify", str(good), "--key", str(keys[1]), "--any-verdict")[0] == 0
    stranger = Key.generate().public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "stranger.pub").write_bytes(stranger)
    code, out, err = _cli(capsys, "verify", str(path), "--key", str(tmp_path / "stranger.pub"), "--any-verdict")
    assert code == 1 and "not signed by this key" in _one_line(err)


def test_unusable_inputs_are_exit_2_one_line(keys, tmp_path, capsys, tiergate_home):
    cand, ref = _models(tmp_path)
    path, _ = _attested(tmp_path, keys[0], cand, ref)
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    (tmp_path / "rsa.pem").write_bytes(rsa_key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    (tmp_path / "rsa.pub").write_bytes(rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (tmp_path / "garbage.pem").write_text("not a key\n")
    verify = {
        "no envelope": (["verify", str(tmp_path / "none.json"), "--key", str(keys[1]), "--any-verdict"], "no such file"),
        "no key": (["verify", str(path), "--key", str(tmp_path / "none.pub"), "--any-verdict"], "no such file"),
        "RSA public key": (["verify", str(path), "--key", str(tmp_path / "rsa.pub"), "--any-verdict"], "not an Ed25519 public key"),
        "private key": (["verify", str(path), "--key", str(keys[0]), "--any-verdict"], "is a private key"),
        "garbage key": (["verify", str(path), "--key", str(tmp_path / "garbage.pem"), "--any-verdict"], "not a PEM public key"),
        "no candidate": (["verify", str(path), "--key", str(keys[1]), "--candidate", str(tmp_path / "none.onnx")],
                         "none.onnx"),
    }
    gate = ["gate", "--candidate", str(cand), "--reference", str(ref), "--data", str(tmp_path / "eval.npz"),
            "--targets", X86]
    np.savez(tmp_path / "eval.npz", x=np.zeros((4, 4), np.float32))
    out_file = str(tmp_path / "out.intoto.json")
    gates = {
        "--attest alone": (gate + ["--attest", out_file], "--attest needs --signing-key"),
        "--signing-key alone": (gate + ["--signing-key", str(keys[0])], "give --attest"),
        "RSA signing key": (gate + ["--attest", out_file, "--signing-key", str(tmp_path / "rsa.pem")],
                            "not an Ed25519 private key"),
        "public signing key": (gate + ["--attest", out_file, "--signing-key", str(keys[1])], "public key"),
        "garbage signing key": (gate + ["--attest", out_file, "--signing-key", str(tmp_path / "garbage.pem")],
                                "not a PEM private key"),
        "no signing key": (gate + ["--attest", out_file, "--signing-key", str(tmp_path / "none")], "no such file"),
        "attest onto the candidate": (gate + ["--attest", str(cand), "--signing-key", str(keys[0])],
                                      "would overwrite an input"),
        "attest onto the key": (gate + ["--attest", str(keys[0]), "--signing-key", str(keys[0])],
                                "would overwrite an input"),
        "attest onto the JUnit file": (gate + ["--attest", out_file, "--signing-key", str(keys[0]), "--junit",
                                               out_file], "also where"),
    }
    for what, (args, says) in {**verify, **gates}.items():
        code, out, err = _cli(capsys, *args)
        line = _one_line(err)
        assert code == 2 and says in line and line.startswith("tiergate: error: "), (what, code, err)
    assert cand.read_bytes().startswith(b"\x08") and keys[0].read_bytes().startswith(b"-----BEGIN PRIVATE KEY")
    assert not (tmp_path / "out.intoto.json").exists() and not list(tiergate_home.glob("runs/*"))
