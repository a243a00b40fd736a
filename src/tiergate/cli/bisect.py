"""`tiergate bisect`: the smallest set of optimizer passes (or of a recipe's options) behind a failing check on one
tier (tiergate.orchestrator.bisect; docs/bisect.md).

Exit 0 when the culprits are found (or nothing fails), 1 when no set of the passes searched is to blame, 2 unusable
input or environment, 3 when a step that decides it is inconclusive. The request's options are the gate's own
(tiergate.request.GATE_OPTIONS, less what a bisection sets itself), plus the options below.
"""

from __future__ import annotations

import json

import typer

from tiergate.cli.options import command
from tiergate.request import GATE_OPTIONS, Option, is_mlflow_uri

DOC = ("Find the optimizer passes (or recipe options) that make a check fail on one tier: delta debugging, each "
       "step an ordinary cached gate on that tier. Exit 0 found, 1 not the passes, 3 inconclusive.")

_KEPT = {"candidate", "reference", "data", "sample_axis", "metric", "incumbent", "policy", "registry_url",
         "base_image", "ca_bundle", "max_parallel", "shards"}
BISECT_OPTIONS: tuple[Option, ...] = tuple(o for o in GATE_OPTIONS if o.param in _KEPT) + (
    Option("target", ("--target", "-t"), "text", "request", "The one device class the check fails on.",
           required=True),
    Option("check", ("--check",), "text", "request",
           "The check to make pass, by its label (e.g. accuracy_noninferior, cosine[probs]); default: the first "
           "that fails on the tier."),
    Option("passes", ("--passes",), "text", "request",
           "PASS,PASS,...: the passes to search (default: those the tier's runtime reports changing the candidate's "
           "graph: onnxruntime's graph transformers, XNNPACK for LiteRT, TVM's passes)."),
    Option("recipe", ("--recipe",), "text", "request",
           "FILE.py:FUNCTION(options: dict, output: str) that writes the candidate from a configuration: bisect the "
           "options that differ between --good and --bad instead of passes (the candidate option is then unused "
           "but for its format)."),
    Option("good", ("--good",), "path", "request", "With --recipe: a configuration (TOML) whose candidate passes."),
    Option("bad", ("--bad",), "path", "request", "With --recipe: a configuration (TOML) whose candidate fails."),
    Option("first", ("--first",), "flag", "request",
           "Stop at the first minimal set, searched from the last pass (default: search again from the first pass, "
           "so that another set that is enough alone is named too).", default=False),
    Option("as_json", ("--json",), "flag", "output",
           "Print {\"culprits\", \"steps\", \"check\", ...} as JSON.", default=False),
)


def run_bisect(values: dict) -> None:
    from rich.console import Console

    from tiergate import orchestrator
    from tiergate.cli.gate_output import prepare
    from tiergate.errors import InputError
    from tiergate.orchestrator.bisect import bisect_passes, bisect_recipe
    from tiergate.request import build_settings

    from tiergate.cli.explain import _stop_on_signals

    _stop_on_signals()                                # SIGINT/SIGTERM clean up as they do for a gate
    recipe, good, bad = values["recipe"], values["good"], values["bad"]
    if recipe and (good is None or bad is None):
        raise InputError("--recipe needs --good A.toml and --bad B.toml")
    if not recipe and (good is not None or bad is not None):
        raise InputError("--good and --bad go with --recipe FILE.py:FUNCTION")
    if recipe and (values["passes"] or values["first"]):
        raise InputError("--passes and --first go with passes; --recipe bisects a recipe's options: give one")
    if any(is_mlflow_uri(values.get(role)) for role in ("candidate", "reference", "incumbent")):
        from tiergate.mlflow_bridge import fetch_values

        values, _ = fetch_values(values)            # models:/ artifacts fetched as the gate does
    if "," in str(values["target"]):
        raise InputError(f"--target {values['target']}: bisect searches one device class; run it once per class")
    full = {**values, "targets": values["target"], "report_dir": None, "junit": None, "early_stop": False,
            "profile": False, "disable_pass": ()}
    request, build = prepare(full), build_settings(full)
    err = Console(stderr=True)
    progress = None if values["as_json"] else (lambda text: err.print(f"[dim]… {text}[/]", highlight=False))
    registry = None
    if values["registry_url"]:
        from tiergate.registry import Registry

        registry = Registry(values["registry_url"])
    options = orchestrator.RunOptions(registry=registry, max_parallel=values["max_parallel"],
                                      shards=values["shards"], progress=progress)
    seams = orchestrator.Seams(builder=orchestrator.DockerBuilder(build))
    target = request.device_classes[0].name
    try:
        if recipe:
            report = bisect_recipe(request, target, recipe, good, bad, check=values["check"], seams=seams,
                                   options=options)
        else:
            passes = [p.strip() for p in (values["passes"] or "").split(",") if p.strip()] or None
            report = bisect_passes(request, target, check=values["check"], passes=passes, seams=seams,
                                   options=options, alternatives=not values["first"])
    finally:
        if registry is not None:
            registry.close()
    if values["as_json"]:
        typer.echo(json.dumps(report.to_json(), indent=2, default=str))
    else:
        for line in report.lines():
            typer.echo(line)
    raise typer.Exit(report.exit_code)


bisect = command(BISECT_OPTIONS, run_bisect, DOC)


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect)
