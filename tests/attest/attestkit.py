"""An independent DSSE / in-toto check, written from the specs with `cryptography` alone (no tiergate code):
the tests hold tiergate's attestations against it rather than against `tiergate verify`."""

from __future__ import annotations

import base64
import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

IN_TOTO = "application/vnd.in-toto+json"
STATEMENT_V1 = "https://in-toto.io/Statement/v1"


def dsse_pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body, LEN in ASCII decimal bytes."""
    kind = payload_type.encode("utf-8")
    return b" ".join([b"DSSEv1", str(len(kind)).encode(), kind, str(len(body)).encode(), body])


def statement_of(envelope: dict, public_pem: bytes) -> dict:
    """The in-toto statement of a DSSE envelope whose one signature verifies with this Ed25519 key (else raises
    cryptography.exceptions.InvalidSignature or AssertionError)."""
    key = load_pem_public_key(public_pem)
    assert isinstance(key, Ed25519PublicKey)
    assert envelope["payloadType"] == IN_TOTO
    body = base64.b64decode(envelope["payload"], validate=True)
    (signature,) = envelope["signatures"]
    key.verify(base64.b64decode(signature["sig"], validate=True), dsse_pae(envelope["payloadType"], body))
    statement = json.loads(body)
    assert statement["_type"] == STATEMENT_V1
    return statement


def with_payload(envelope: dict, body: bytes) -> dict:
    """The same envelope (same signatures) around another payload."""
    return {**envelope, "payload": base64.b64encode(body).decode()}


def payload(envelope: dict) -> bytes:
    return base64.b64decode(envelope["payload"])
