"""`tiergate gate`: run the candidate and its FP32 reference on every device class, then decide.

Exit 0 PROMOTE, 1 REJECT, 2 unusable input or environment, 3 INCONCLUSIVE. The options are
tiergate.request.GATE_OPTIONS (the one definition the fast path of an unchanged re-run parses too).
Artifacts may be MLflow models:/ URIs (tiergate.mlflow_bridge, docs/mlflow.md): fetched first, then gated as
files; the candidate's version is tagged after the decision is written (a failure there: exit 2, the decision
files and output are kept).
"""

from __future__ import annotations

import threading
from pathlib import Path

import typer

from tiergate.cli.options import command
from tiergate.request import GATE_OPTIONS

DOC = "Gate a candidate: PROMOTE (exit 0), REJECT (exit 1) or INCONCLUSIVE (exit 3), every check listed."


def run_gate(values: dict) -> None:
    """The gate command's body, on the parsed option values (tiergate.request.parse's shape)."""
    from rich.console import Console

    from tiergate import quickgate
    from tiergate.cli.gate_output import attestation, json_text, prepare, print_run
    from tiergate.reports.gate_files import write_reports
    from tiergate.request import build_settings

    values, sources = _from_mlflow(values)
    request, build = prepare(values), build_settings(values)
    attest = attestation(values, request)          # the signing key checked before anything runs
    err = Console(stderr=True)
    progress = None if values["as_json"] else (lambda text: err.print(f"[dim]… {text}[/]", highlight=False))
    # an unchanged request is answered from the decision cache before anything heavy is imported (no fast
    # path with a registry: recording needs the normal path's runs)
    run = quickgate.lookup(request, build) if not values["registry_url"] else None
    recorded = None
    if run is not None:
        if progress is not None:
            progress("unchanged: the decision from the cache (nothing loaded, built or run)")
    else:
        run, recorded = _gate(request, build, values, progress, sources)
    lineage = _lineage(sources)
    write_reports(run, values["report_dir"], values["junit"], lineage, attest)
    explained = _explain(run, request, build, progress) if values["explain"] else None
    if explained is not None and recorded is not None:       # the drift report links it to the decision
        registry = _registry(values["registry_url"])
        try:
            registry.record_explanation(recorded.id, explained.to_json())
        finally:
            registry.close()
    if values["as_json"]:
        typer.echo(json_text(run, explained, lineage))
    else:
        print_run(run, explained)
    if "candidate" in sources:
        _to_mlflow(run, sources["candidate"], values, lineage, err)
    raise typer.Exit(run.decision.exit_code)


def _from_mlflow(values: dict) -> tuple[dict, dict]:
    """The values with models:/ artifacts fetched from MLflow (their files), and those sources by role."""
    from tiergate.request import is_mlflow_uri

    if not values.get("mlflow_promote") and not any(is_mlflow_uri(values.get(r))
                                                     for r in ("candidate", "reference", "incumbent")):
        return values, {}
    from tiergate.mlflow_bridge import fetch_values

    return fetch_values(values)


def _lineage(sources: dict) -> dict | None:
    if not sources:
        return None
    from tiergate.mlflow_bridge import lineage

    return lineage(sources)


def _to_mlflow(run, source, values: dict, lineage, err) -> None:
    """Tag the candidate's MLflow version with the decision (and move --mlflow-promote's alias on PROMOTE).
    The decision is already written and printed: a failure here says so, and exits 2 (not the verdict's code)."""
    from tiergate.errors import EnvironmentProblem, TiergateError
    from tiergate.mlflow_bridge import write_back
    from tiergate.reports.gate_files import decision_sha256

    decision = run.decision
    sha = decision_sha256(decision, lineage)
    summary = run.report_files.get("markdown")
    report = str(Path(summary).resolve()) if summary else None
    try:
        for line in write_back(source, decision, sha, report=report, promote=values.get("mlflow_promote")):
            err.print(f"mlflow: {line}", highlight=False, markup=False)
    except TiergateError as exc:
        raise EnvironmentProblem(f"the decision is {decision.verdict} (exit {decision.exit_code}; its files and "
                                 f"output are written) but MLflow was not updated: {exc.one_line()}") from None


def _gate(request, build, values: dict, progress, sources: dict | None = None):
    """The normal path: intake, build, run (or reuse), decide; then record it in the registry (the decision
    record comes back with the run) or remember it for the fast path (None)."""
    from tiergate import orchestrator, quickgate

    if threading.current_thread() is threading.main_thread():
        from tiergate.execution import janitor

        janitor.install_signal_handlers()
    registry = _registry(values["registry_url"])
    if registry is not None and sources and "candidate" in sources:
        _register_mlflow(registry, request, sources["candidate"])   # with its MLflow identity as tags
    recorder = quickgate.Recorder(orchestrator.DockerBuilder(build))
    options = orchestrator.RunOptions(registry=registry, records=registry is not None,
                                      max_parallel=values["max_parallel"], shards=values["shards"], progress=progress)
    from tiergate import leases

    # the images the gate used stay leased until the fast path has saved what names them: a tiergate gc between
    # the gate's end and the save (another user's, another test's) would leave nothing remembered
    with leases.holding():
        run = orchestrator.gate(request, orchestrator.Seams(builder=recorder), options)
        if registry is not None:
            recorded, _ = orchestrator.record_or_reuse(registry, run)
            return run, recorded
        quickgate.remember(request, build, run, recorder)
    return run, None


def _register_mlflow(registry, request, source) -> None:
    from tiergate.mlflow_bridge import registry_tags
    from tiergate.registry import register_artifact
    from tiergate.registry.names import model_name

    model_name(source.name)
    register_artifact(registry, request.candidate, model=source.name, reference=request.reference,
                      tags=registry_tags(source))


def _registry(url: str | None):
    if not url:
        return None
    from tiergate.registry import Registry

    return Registry(url)


def _explain(run, request, build, progress):
    """After a REJECT: tiergate explain on the same tiers (never part of the cached decision)."""
    if run.decision.verdict != "REJECT":
        return None
    from tiergate.errors import TiergateError
    from tiergate.execution.explain import explain
    from tiergate.explain import Explanation, TierExplain
    from tiergate.orchestrator.explain_ab import docker_runner

    classes = list(request.device_classes)
    try:
        return explain(request.candidate, request.reference, request.data, classes, request.policy,
                       runner=docker_runner(build), progress=progress)
    except TiergateError as exc:       # the verdict stands; say why no layer could be named
        return Explanation(str(request.candidate), str(request.reference),
                           {dc.name: TierExplain(dc.name, 0.0, error=exc.one_line()) for dc in classes})


gate = command(GATE_OPTIONS, run_gate, DOC)


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
