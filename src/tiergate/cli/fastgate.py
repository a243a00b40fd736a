"""`tiergate gate` unchanged: answered from the decision cache before typer (or anything heavy) is imported.

`answer(args)` parses the gate's options with a small stdlib parser (the same names, flags and
repeatable options as the typer command in cli/gate.py; a test keeps the two equal) and asks
tiergate.quickgate. It returns the exit code when the fast path answered, and None for anything
else (an option it does not know, --help, --registry, --explain, a value that is not one, unusable
input, a request that is not unchanged): then the typer command runs as always, and it reports
every error itself. Saving the typer start (about 0.1-0.2 s here) is what brings an unchanged re-run
to a few percent of a warm one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# option -> (parameter, kind): "value", "many" (repeatable), "flag"; cli/gate.py's options, one for one
OPTIONS = {
    "--candidate": ("candidate", "value"), "-c": ("candidate", "value"),
    "--reference": ("reference", "value"), "-r": ("reference", "value"),
    "--data": ("data", "value"), "-d": ("data", "value"),
    "--sample-axis": ("sample_axis", "many"),
    "--metric": ("metric", "many"),
    "--targets": ("targets", "value"), "-t": ("targets", "value"),
    "--incumbent": ("incumbent", "value"),
    "--policy": ("policy", "value"),
    "--junit": ("junit", "value"),
    "--report-dir": ("report_dir", "value"),
    "--json": ("as_json", "flag"),
    "--registry": ("registry_url", "value"),
    "--base-image": ("base_image", "value"),
    "--ca-bundle": ("ca_bundle", "value"),
    "--max-parallel": ("max_parallel", "value"),
    "--shards": ("shards", "value"),
    "--early-stop": ("early_stop", "flag"),
    "--no-early-stop": ("early_stop", "flag-off"),
    "--profile": ("profile", "flag"),
    "--explain": ("explain", "flag"),
}
REQUIRED = ("candidate", "reference", "data", "targets")
REGISTRY_ENV = "TIERGATE_REGISTRY_URL"       # the --registry option's envvar
PATHS = ("candidate", "reference", "incumbent", "policy", "junit", "report_dir", "ca_bundle")


def parse(args: list[str]) -> dict | None:
    """The options as the gate command's parameters, or None when this parser is not sure."""
    found: dict = {"sample_axis": [], "metric": []}
    i = 0
    while i < len(args):
        token = args[i]
        name, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        if name not in OPTIONS:
            return None
        param, kind = OPTIONS[name]
        if kind in ("flag", "flag-off"):
            if eq or param in found:
                return None
            found[param] = kind == "flag"
            i += 1
            continue
        if eq:
            value = inline
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            value = args[i + 1]
            i += 2
        else:
            return None
        if kind == "many":
            found[param].append(value)
        elif param in found:
            return None           # given twice: leave it to the full parser
        else:
            found[param] = value
    if any(p not in found for p in REQUIRED):
        return None
    try:
        if int(found.get("max_parallel", "2")) < 1 or int(found.get("shards", "1")) < 1:
            return None
    except ValueError:
        return None
    for param in PATHS:
        if param in found:
            found[param] = Path(found[param])
    return found


def answer(args: list[str]) -> int | None:
    """The exit code of `tiergate gate ARGS` answered from the decision cache, or None (run the typer command)."""
    options = parse(args)
    if options is None or options.get("explain") or options.get("registry_url") or os.environ.get(REGISTRY_ENV):
        return None
    try:
        from tiergate import quickgate
        from tiergate.cli.gate_output import json_text, prepare, print_run
        from tiergate.reports.gate_files import write_reports

        request = prepare(options["candidate"], options["reference"], options["data"], options["targets"],
                          incumbent=options.get("incumbent"), policy=options.get("policy"),
                          junit=options.get("junit"), report_dir=options.get("report_dir"),
                          metric=options["metric"], sample_axis=options["sample_axis"],
                          base_image=options.get("base_image"), ca_bundle=options.get("ca_bundle"),
                          profile=bool(options.get("profile")), early_stop=options.get("early_stop"))
        run = quickgate.lookup(request)
    except Exception:  # noqa: BLE001 - the typer command reports every error itself
        if os.environ.get("TIERGATE_DEBUG"):
            raise
        return None
    if run is None:
        return None
    write_reports(run, options.get("report_dir"), options.get("junit"))
    if options.get("as_json"):
        sys.stdout.write(json_text(run) + "\n")
    else:
        from rich.console import Console

        Console(stderr=True).print("[dim]… unchanged: the decision from the cache (nothing loaded, built or run)[/]",
                                   highlight=False)
        print_run(run)
    return run.decision.exit_code
