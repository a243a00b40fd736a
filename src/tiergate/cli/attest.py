"""Signed decisions: `tiergate keygen PATH` and `tiergate verify FILE --key PATH.pub --candidate FILE`.

`tiergate gate --attest FILE --signing-key PATH` writes the attestation (tiergate.attest, through
reports.gate_files.write_reports). verify: exit 0 only when it holds for a PROMOTE of the candidate given (the
attested verdict printed), 1 when it does not (one line saying why: bad signature, another subject, a REJECT or
INCONCLUSIVE, another reference or policy when asked), 2 for unusable input (a missing file, a key that is not an
Ed25519 public key, neither --candidate nor --any-verdict). `--any-verdict` is the auditor's check (any verdict).
"""

from __future__ import annotations

from pathlib import Path

import typer


def keygen(path: Path = typer.Argument(..., help="Where the private key goes; the public key goes to PATH.pub.")
           ) -> None:
    """Make an Ed25519 key pair for signed decisions: PATH (private, PEM PKCS8, mode 0600) and PATH.pub (public).
    Never overwrites a file, never makes a folder (exit 2)."""
    from tiergate import attest
    from tiergate.errors import InputError
    from tiergate.paths import check_outputs

    path = Path(path)
    if not path.parent.is_dir():       # a mistyped folder is a mistake, not a place to create (check_outputs would)
        raise InputError(f"{path}: its folder {path.parent} does not exist; tiergate keygen makes no folders")
    check_outputs([("PATH", path), ("PATH.pub", attest.public_path(path))], [])
    private, public = attest.generate(path)
    typer.echo(f"private key: {private} (keep it secret; gate --signing-key {private})")
    typer.echo(f"public key: {public} (verify --key {public}); keyid "
               f"{attest.keyid(attest.load_public_key(public))}")


MAX_ENVELOPE_BYTES = 16 << 20      # an attestation of ours is a few KB


def verify(file: Path = typer.Argument(..., help="The attestation (DSSE envelope) tiergate gate --attest wrote."),
           key: Path = typer.Option(..., "--key", help="The Ed25519 public key (PATH.pub of tiergate keygen)."),
           candidate: Path = typer.Option(None, "--candidate",
                                          help="The file to deploy (or its MLflow models:/ URI): it must be the "
                                               "attested candidate (its content hash, ONNX external data included). "
                                               "Required unless --any-verdict."),
           any_verdict: bool = typer.Option(False, "--any-verdict",
                                            help="An auditor's check: exit 0 for a valid signature over tiergate's "
                                                 "statement whatever its verdict (REJECT, INCONCLUSIVE too), with or "
                                                 "without --candidate. Never for a deploy step."),
           reference: Path = typer.Option(None, "--reference",
                                          help="Also require that the gate compared against this FP32 reference "
                                               "(its content hash)."),
           policy_sha256: str = typer.Option(None, "--policy-sha256",
                                             help="Also require the policy of this hash (predicate.policy.sha256 of "
                                                  "an attestation the team approved).")) -> None:
    """Check a signed decision before a deploy: exit 0 only when the signature holds over DSSE's PAE with KEY, the
    payload is tiergate's in-toto statement about CANDIDATE and its verdict is PROMOTE; 1 otherwise (one line
    saying why). --any-verdict: an auditor's check of the signature alone (any verdict)."""
    from tiergate import attest
    from tiergate.errors import InputError
    from tiergate.paths import read_regular

    if candidate is None and not any_verdict:
        raise InputError("verify needs --candidate FILE (the file a deploy step ships: exit 0 only for a PROMOTE of "
                         "it), or --any-verdict for an auditor's check of the signature whatever the verdict")
    public_key = attest.load_public_key(key)
    data = read_regular(Path(file), "attestation", MAX_ENVELOPE_BYTES)
    from tiergate.mlflow_bridge import local_artifact        # a models:/ URI: the version MLflow names now

    expected = attest.content_sha256(local_artifact(candidate)) if candidate is not None else None
    reference_sha = attest.content_sha256(local_artifact(reference, "reference")) if reference is not None else None
    statement = attest.verify(data, public_key, expected)
    predicate = attest.require(statement, promote=not any_verdict, reference_sha256=reference_sha,
                               policy_sha256=policy_sha256)
    name, sha256 = next((n, d) for n, d in attest.subjects(statement) if expected in (None, d))
    verdict = attest.printable(predicate.get("verdict", "?"), 40)
    typer.echo(f"verified: {verdict} for {attest.printable(name)} (sha256 {attest.printable(sha256, 80)}), signed "
               f"by keyid {attest.keyid(public_key)}"
               + ("; the candidate file is the subject" if candidate is not None else "")
               + ("; the reference file is the statement's" if reference is not None else "")
               + ("; the policy is the one given" if policy_sha256 is not None else ""))


def register(app: typer.Typer) -> None:
    app.command("keygen")(keygen)
    app.command("verify")(verify)
