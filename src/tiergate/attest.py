"""Signed decisions: an in-toto Statement v1 about the candidate, in a DSSE envelope signed with Ed25519.

- `generate(path)`: a key pair for `tiergate keygen`: PATH (private, PEM PKCS8, mode 0600) and PATH.pub (public,
  PEM SubjectPublicKeyInfo); never overwrites a file.
- `Attestation(path, key, request).write(gate_run)`: what `tiergate gate --attest FILE --signing-key KEY` writes,
  from the normal path and the fast path of an unchanged re-run alike (reports.gate_files.write_reports). The
  statement holds nothing time-dependent: the same decision attests to the same payload.
- `verify(data, public_key, candidate_sha256=None)`: the statement when the signature holds over DSSE's PAE (and
  the candidate is the subject); `AttestationRefused` (exit 1) with one line saying why; unusable input is
  InputError (exit 2). The envelope is strict JSON (no duplicated key, bounded nesting: a parser that keeps the
  first of two keys must not read another statement than ours); base64 standard or URL-safe, padded or not (DSSE).
- `require(statement, ...)`: what a deploy step asks of a verified statement: by default a PROMOTE (`tiergate
  verify` without --any-verdict), optionally the reference's content hash and the policy's hash.
- `printable(text)`: a value from an envelope as one line for a terminal (control characters escaped).

Shapes: docs/json-shapes.md ("Signed decisions"). The DSSE signature is over
PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body (LEN: the byte length in ASCII decimal).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiergate import state
from tiergate.decision import GateRun
from tiergate.errors import EXIT_FAIL, InputError, TiergateError
from tiergate.reports.gate_files import decision_sha256
from tiergate.request import GateRequest

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://tiergate.dev/attestation/gate-decision/v1"
PUBLIC_SUFFIX = ".pub"


class AttestationRefused(TiergateError):
    """The attestation does not hold (signature, key, subject, shape): exit 1, one line."""

    exit_code = EXIT_FAIL


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding of a payload: what is signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


# --- keys -----------------------------------------------------------------------------------------------


def public_path(path: Path) -> Path:
    return Path(str(path) + PUBLIC_SUFFIX)


def generate(path: Path) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair: `path` (private, PKCS8 PEM, 0600) and `path`.pub (SubjectPublicKeyInfo PEM).
    An existing file at either place is refused (InputError), never overwritten."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path, pub = Path(path), public_path(path)
    for target in (path, pub):
        if target.exists() or target.is_symlink():
            raise InputError(f"{target}: already exists; tiergate keygen never overwrites a key (give another path)")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    _create(path, private_pem, 0o600)
    _create(pub, public_pem, 0o644)
    return path, pub


def _create(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise InputError(f"{path}: already exists; tiergate keygen never overwrites a key") from None
    try:
        os.fchmod(fd, mode)          # whatever the umask
        os.write(fd, data)
    finally:
        os.close(fd)


def _read_key_file(path: Path, what: str) -> bytes:
    """A key file's bytes: a regular file (never a FIFO or a device), at most 1 MiB (a PEM key is a few hundred)."""
    from tiergate.paths import read_regular

    return read_regular(Path(path), what, 1 << 20)


def load_private_key(path: Path):
    """The Ed25519 private key in a PEM file (tiergate keygen's), or InputError naming the file."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read_key_file(path, "--signing-key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise InputError(f"--signing-key {path}: is encrypted; give an unencrypted Ed25519 key "
                         "(tiergate keygen)") from None
    except (ValueError, binascii.Error):
        hint = " (that is a public key; sign with the private one)" if b"PUBLIC KEY" in data else ""
        raise InputError(f"--signing-key {path}: not a PEM private key{hint}") from None
    except Exception as exc:  # noqa: BLE001 - cryptography's unsupported-algorithm errors
        raise InputError(f"--signing-key {path}: not a usable private key ({type(exc).__name__})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"--signing-key {path}: is {type(key).__name__.lstrip('_')}, not an Ed25519 private key "
                         "(tiergate keygen makes one)")
    return key


def load_public_key(path: Path):
    """The Ed25519 public key in a PEM file (PATH.pub of tiergate keygen), or InputError naming the file."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = _read_key_file(path, "--key")
    if b"PRIVATE KEY" in data:
        raise InputError(f"--key {path}: is a private key; verify with the public one ({public_path(path).name})")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, binascii.Error):
        raise InputError(f"--key {path}: not a PEM public key") from None
    except Exception as exc:  # noqa: BLE001 - cryptography's unsupported-algorithm errors
        raise InputError(f"--key {path}: not a usable public key ({type(exc).__name__})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(f"--key {path}: is {type(key).__name__.lstrip('_')}, not an Ed25519 public key")
    return key


def keyid(public_key) -> str:
    """A key's id in the envelope: the sha256 of its SubjectPublicKeyInfo (DER), hex."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


# --- the statement and its envelope -------------------------------------------------------------------------


def statement(gate_run: GateRun, request: GateRequest, lineage: dict | None = None) -> dict:
    """The in-toto Statement v1 of a gate's decision: subject the candidate (file name, content hash as intake
    computes it), predicate the verdict, every check, the tiers, the reference's and the policy's hashes, the
    decision's hash and key, tiergate's version. Made from what both paths hold (GateRun, the request)."""
    from tiergate import __version__

    decision = gate_run.decision
    hashes = gate_run.artifact_hashes()
    predicate = {
        "verdict": decision.verdict,
        "quantized": decision.quantized,
        "checks": [check.to_json() for check in decision.checks],
        "reasons": decision.reasons,
        "tiers": [_tier(dc, gate_run) for dc in request.device_classes],
        "reference": _named(request.reference, hashes.get("reference")),
        "incumbent": _named(request.incumbent, hashes.get("incumbent")) if request.incumbent else None,
        "policy": {"sha256": state.policy_identity(request.policy), "sources": list(decision.policy_sources)},
        "decision": {"sha256": decision_sha256(decision, lineage), "key": gate_run.decision_key or None},
        "tiergate": {"version": __version__},
    } | ({"lineage": lineage} if lineage else {})
    return {"_type": STATEMENT_TYPE, "subject": [_named(request.candidate, hashes.get("candidate"))],
            "predicateType": PREDICATE_TYPE, "predicate": predicate}


def _named(path: Path, sha256: str | None) -> dict:
    if not sha256:
        raise InputError(f"{path}: no content hash to attest (the gate did not take it in)")
    return {"name": Path(path).name, "digest": {"sha256": sha256}}


def _tier(dc, gate_run: GateRun) -> dict:
    """A tier as its candidate run saw it: the CPU its runtime saw, the runtime and its versions."""
    folder = gate_run.run_dirs.get(("candidate", dc.name))
    result = (state.read_result(Path(folder)) if folder is not None else None) or {}
    graph = gate_run.runtime.get(dc.name, {})
    metrics = gate_run.decision.metrics.get(dc.name)
    return {"device_class": dc.name, "tier": dc.tier,
            "emulated": bool(result.get("emulated", metrics.emulated if metrics is not None else False)),
            "machine": result.get("machine") or graph.get("machine") or "",
            "cpu": result.get("cpu") or graph.get("cpu") or {},
            "runtime": result.get("runtime") or dc.runtime,
            "runtime_versions": result.get("versions") or {}}


def payload_bytes(doc: dict) -> bytes:
    """The statement as the payload: canonical JSON (sorted keys, no spaces), UTF-8."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


def envelope(doc: dict, private_key) -> dict:
    """A DSSE envelope of the statement, signed over PAE with the Ed25519 key."""
    body = payload_bytes(doc)
    signature = private_key.sign(pae(PAYLOAD_TYPE, body))
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": keyid(private_key.public_key()), "sig": base64.b64encode(signature).decode()}]}


@dataclass(frozen=True)
class Attestation:
    """Where `tiergate gate --attest` writes, the key that signs, and the request the statement is about."""

    path: Path
    key: Any                    # an Ed25519PrivateKey
    request: GateRequest

    def write(self, gate_run: GateRun, lineage: dict | None = None) -> Path:
        doc = envelope(statement(gate_run, self.request, lineage), self.key)
        from tiergate.paths import write_new

        return write_new(Path(self.path), (json.dumps(doc, indent=1) + "\n").encode())


def attestation(attest: Path | None, signing_key: Path | None, request: GateRequest) -> Attestation | None:
    """The gate's --attest/--signing-key as an Attestation (the key loaded and checked), None when neither is
    given; one without the other is InputError."""
    if attest is None and signing_key is None:
        return None
    if signing_key is None:
        raise InputError("--attest needs --signing-key (an Ed25519 private key: tiergate keygen PATH)")
    if attest is None:
        raise InputError("--signing-key signs an attestation: give --attest FILE too")
    return Attestation(Path(attest), load_private_key(Path(signing_key)), request)


# --- verifying ---------------------------------------------------------------------------------------------


MAX_DEPTH = 64                      # nesting deeper than any statement of ours: refused before it is parsed


def _b64(text, what: str) -> bytes:
    """DSSE's base64: standard or URL-safe, with or without padding (nothing else: no spaces, no mixed alphabets)."""
    if not isinstance(text, str):
        raise AttestationRefused(f"not a DSSE envelope: {what} is not a base64 string")
    url_safe = "-" in text or "_" in text
    if url_safe and ("+" in text or "/" in text):
        raise AttestationRefused(f"not a DSSE envelope: {what} mixes standard and URL-safe base64")
    body = text.rstrip("=")
    padded = body + "=" * (-len(body) % 4)
    if len(text) - len(body) > 2 or (len(text) != len(body) and len(text) != len(padded)):
        raise AttestationRefused(f"not a DSSE envelope: {what} is not base64 (bad padding)")
    try:
        alphabet = b"-_" if url_safe else None
        return base64.b64decode(padded, altchars=alphabet, validate=True)
    except (binascii.Error, ValueError):
        raise AttestationRefused(f"not a DSSE envelope: {what} is not base64") from None


def _strict_json(data: bytes | str, what: str):
    """JSON with no duplicated key in any object and nesting at most MAX_DEPTH deep; AttestationRefused otherwise."""
    def pairs(items):
        doc = {}
        for key, value in items:
            if key in doc:
                raise AttestationRefused(f"{what} holds the key {printable(key)!s} twice (refused: two readers could "
                                         "read two documents)")
            doc[key] = value
        return doc

    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    depth = deepest = 0
    in_string = escaped = False
    for char in text:                       # a cheap pre-scan: no recursion limit reached inside the parser
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                raise AttestationRefused(f"{what} is nested more than {MAX_DEPTH} levels deep (refused)")
        elif char in "]}":
            depth -= 1
    return json.loads(text, object_pairs_hook=pairs)


def printable(text, limit: int = 200) -> str:
    """A value read from an envelope as one line for people: control and other non-printing characters escaped
    (a newline in a subject's name cannot forge a second line), at most `limit` characters."""
    value = str(text)
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in value)
    return shown if len(shown) <= limit else shown[:limit] + "…"


def verify(data: bytes, public_key, candidate_sha256: str | None = None) -> dict:
    """The statement of a DSSE envelope when its signature holds over PAE with `public_key`, it is an in-toto
    Statement v1 of tiergate's predicate type, and (given) the candidate's content hash is a subject's digest;
    AttestationRefused (one line) otherwise."""
    from cryptography.exceptions import InvalidSignature

    try:
        doc = _strict_json(data, "the envelope")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise AttestationRefused("not a DSSE envelope: not JSON") from None
    if not isinstance(doc, dict) or not {"payloadType", "payload", "signatures"} <= set(doc):
        raise AttestationRefused("not a DSSE envelope: it needs payloadType, payload and signatures")
    if doc["payloadType"] != PAYLOAD_TYPE:
        raise AttestationRefused(f"payloadType is {printable(repr(doc['payloadType']))}, not {PAYLOAD_TYPE}")
    body = _b64(doc["payload"], "payload")
    signatures = doc["signatures"]
    if not isinstance(signatures, list) or not signatures or not all(isinstance(s, dict) for s in signatures):
        raise AttestationRefused("not a DSSE envelope: no signatures")
    message, ours = pae(PAYLOAD_TYPE, body), keyid(public_key)
    for entry in signatures:
        try:
            public_key.verify(_b64(entry.get("sig"), "a signature"), message)
            break
        except (InvalidSignature, AttestationRefused):
            continue
    else:
        ids = sorted({str(s.get("keyid", "")) for s in signatures})
        if ours in ids:
            raise AttestationRefused("bad signature: the payload or its signature changed after it was signed")
        raise AttestationRefused(f"bad signature: not signed by this key (keyid {ours[:16]}…; the envelope names "
                                 f"{', '.join(printable(i, 16) for i in ids if i) or 'no keyid'})")
    try:
        found = _strict_json(body, "the signed payload")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise AttestationRefused("the signed payload is not JSON") from None
    if not isinstance(found, dict) or found.get("_type") != STATEMENT_TYPE:
        raise AttestationRefused(f"the payload is not an in-toto Statement v1 (_type "
                                 f"{printable(repr(found.get('_type')))})"
                                 if isinstance(found, dict) else "the payload is not an in-toto Statement")
    if found.get("predicateType") != PREDICATE_TYPE:
        raise AttestationRefused(f"predicateType is {printable(repr(found.get('predicateType')))}, not tiergate's "
                                 f"{PREDICATE_TYPE}")
    digests = [sha for _, sha in subjects(found)]
    if not digests:
        raise AttestationRefused("the statement names no subject with a sha256 digest")
    if candidate_sha256 is not None and candidate_sha256 not in digests:
        raise AttestationRefused(f"subject digest differs: the candidate's sha256 is {candidate_sha256}, the "
                                 f"statement's subject is {', '.join(digests)}")
    return found


def require(found: dict, *, promote: bool = True, reference_sha256: str | None = None,
            policy_sha256: str | None = None) -> dict:
    """What a deploy step asks of a verified statement (AttestationRefused, one line, otherwise): its verdict is
    PROMOTE (unless `promote` is False: an auditor's check of any verdict), its reference is the file of this
    content hash, its policy the one of this hash. Returns the predicate."""
    predicate = found.get("predicate")
    if not isinstance(predicate, dict):
        raise AttestationRefused("the statement has no predicate")
    verdict = predicate.get("verdict")
    if promote and verdict != "PROMOTE":
        raise AttestationRefused(f"the attested verdict is {printable(verdict, 40)}, not PROMOTE: this decision does "
                                 "not vouch for deploying the candidate (--any-verdict checks the signature of any "
                                 "verdict)")
    if reference_sha256 is not None:
        reference = predicate.get("reference")
        got = reference.get("digest", {}).get("sha256") if isinstance(reference, dict) and \
            isinstance(reference.get("digest"), dict) else None
        if got != reference_sha256:
            raise AttestationRefused(f"reference digest differs: the reference's sha256 is {reference_sha256}, the "
                                     f"statement's is {printable(got, 80)}")
    if policy_sha256 is not None:
        policy = predicate.get("policy")
        got = policy.get("sha256") if isinstance(policy, dict) else None
        if got != policy_sha256:
            raise AttestationRefused(f"policy differs: --policy-sha256 is {printable(policy_sha256, 80)}, the "
                                     f"statement's policy is {printable(got, 80)}")
    return predicate


def subjects(found: dict) -> list[tuple[str, str]]:
    """(name, sha256) of every subject of a statement that names a sha256 digest."""
    listed = found.get("subject")
    if not isinstance(listed, list):
        return []
    return [(str(s.get("name", "")), s["digest"]["sha256"]) for s in listed
            if isinstance(s, dict) and isinstance(s.get("digest"), dict) and isinstance(s["digest"].get("sha256"), str)]


def content_sha256(path: Path) -> str:
    """A file's content hash as tiergate's intake computes it (an ONNX model's external data included)."""
    from tiergate.artifact import load_artifact

    return load_artifact(Path(path)).sha256
