"""`tiergate gate` unchanged: answered from the decision cache before typer (or anything heavy) is imported.

`answer(args)` parses the gate's options with tiergate.request.parse (made from the same option table as
the typer command) and asks tiergate.quickgate. It returns the exit code when the fast path answered, and
None for anything else (an option it is not sure of, --help, --registry, --explain, an MLflow models:/ artifact
or --mlflow-promote, unusable input, a request
that is not unchanged): then the typer command runs as always, and it reports every error itself. Saving the
typer start (about 0.1-0.2 s here) is what brings an unchanged re-run to a few percent of a warm one.
"""

from __future__ import annotations

import os
import sys

from tiergate.request import REGISTRY_ENV, build_settings, is_mlflow_uri, parse


def answer(args: list[str]) -> int | None:
    """The exit code of `tiergate gate ARGS` answered from the decision cache, or None (run the typer command)."""
    values = parse(args)
    if values is None or values["explain"] or values["registry_url"] or os.environ.get(REGISTRY_ENV):
        return None
    if values["mlflow_promote"] or any(is_mlflow_uri(values[role]) for role in ("candidate", "reference", "incumbent")):
        return None      # MLflow: an alias is resolved every time and the version is tagged (cli/gate.py)
    try:
        from tiergate import quickgate
        from tiergate.cli.gate_output import attestation, json_text, prepare, print_run
        from tiergate.reports.gate_files import write_reports

        request = prepare(values)
        attest = attestation(values, request)
        run = quickgate.lookup(request, build_settings(values))
    except Exception:  # noqa: BLE001 - the typer command reports every error itself
        if os.environ.get("TIERGATE_DEBUG"):
            raise
        return None
    if run is None:
        return None
    write_reports(run, values["report_dir"], values["junit"], attest=attest)
    if values["as_json"]:
        sys.stdout.write(json_text(run) + "\n")
    else:
        from rich.console import Console

        Console(stderr=True).print("[dim]… unchanged: the decision from the cache (nothing loaded, built or run)[/]",
                                   highlight=False)
        print_run(run)
    return run.decision.exit_code
