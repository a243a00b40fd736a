"""Signed decisions: `tiergate keygen PATH` and `tiergate verify FILE --key PATH.pub [--candidate FILE]`.

`tiergate gate --attest FILE --signing-key PATH` writes the attestation (tiergate.attest, through
reports.gate_files.write_reports). verify: exit 0 when it holds (the attested verdict printed), 1 when it does
not (one line saying why), 2 for unusable input (a missing file, a key that is not an Ed25519 public key).
"""

from __future__ import annotations

from pathlib import Path

import typer


def keygen(path: Path = typer.Argument(..., help="Where the private key goes; the public key goes to PATH.pub.")
           ) -> None:
    """Make an Ed25519 key pair for signed decisions: PATH (private, PEM PKCS8, mode 0600) and PATH.pub (public).
    Never overwrites a file (exit 2)."""
    from tiergate import attest
    from tiergate.paths import check_outputs

    path = Path(path)
    check_outputs([("PATH", path), ("PATH.pub", attest.public_path(path))], [])
    private, public = attest.generate(path)
    typer.echo(f"private key: {private} (keep it secret; gate --signing-key {private})")
    typer.echo(f"public key: {public} (verify --key {public}); keyid "
               f"{attest.keyid(attest.load_public_key(public))}")


def verify(file: Path = typer.Argument(..., help="The attestation (DSSE envelope) tiergate gate --attest wrote."),
           key: Path = typer.Option(..., "--key", help="The Ed25519 public key (PATH.pub of tiergate keygen)."),
           candidate: Path = typer.Option(None, "--candidate",
                                          help="Also check that this file is the attested candidate (its content "
                                               "hash, ONNX external data included).")) -> None:
    """Check a signed decision: exit 0 (the attested verdict printed) when the signature holds over DSSE's PAE
    with KEY and the payload is tiergate's in-toto statement (about CANDIDATE, when given); 1 otherwise."""
    from tiergate import attest
    from tiergate.errors import InputError

    public_key = attest.load_public_key(key)
    if not Path(file).is_file():
        raise InputError(f"{file}: no such file")
    try:
        data = Path(file).read_bytes()
    except OSError as exc:
        raise InputError(f"{file}: cannot read it ({exc.strerror or exc})") from None
    expected = attest.content_sha256(candidate) if candidate is not None else None
    statement = attest.verify(data, public_key, expected)
    name, sha256 = next((n, d) for n, d in attest.subjects(statement) if expected in (None, d))
    predicate = statement.get("predicate")
    verdict = predicate.get("verdict", "?") if isinstance(predicate, dict) else "?"
    typer.echo(f"verified: {verdict} for {name} (sha256 {sha256}), signed by keyid {attest.keyid(public_key)}"
               + ("; the candidate file is the subject" if candidate is not None else ""))


def register(app: typer.Typer) -> None:
    app.command("keygen")(keygen)
    app.command("verify")(verify)
