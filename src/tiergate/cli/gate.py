"""`tiergate gate`: run the candidate and its FP32 reference on every device class, then decide.

Exit 0 PROMOTE, 1 REJECT, 2 unusable input or environment, 3 INCONCLUSIVE.
"""

from __future__ import annotations

import threading
from pathlib import Path

import typer
from rich.console import Console

from tiergate.cli.gate_output import json_text, print_run


def gate(
    candidate: Path = typer.Option(..., "--candidate", "-c", help="The artifact to gate (ONNX or TFLite)."),
    reference: Path = typer.Option(..., "--reference", "-r", help="Its FP32 reference, same format."),
    data: str = typer.Option(..., "--data", "-d",
                             help=".npz: one array per model input, optional 'labels'; or a loader FILE.py:FUNCTION "
                                  "yielding {input: array} or ({input: array}, label) per sample."),
    sample_axis: list[str] = typer.Option([], "--sample-axis", help="NAME=AXIS: the sample axis of an input "
                                          "(or output) when the model's symbolic dims do not say (repeatable)."),
    metric: list[str] = typer.Option([], "--metric", help="A task metric: a built-in name (top5_accuracy, f1, "
                                     "roc_auc, mean_iou, mae, ...) or FILE.py:FUNCTION(outputs, labels) -> float, "
                                     "higher is better, gated by [metrics.NAME] min_ratio (repeatable)."),
    targets: str = typer.Option(..., "--targets", "-t", help="Device classes, comma-separated."),
    incumbent: Path | None = typer.Option(None, "--incumbent", help="The currently promoted artifact (A/B)."),
    policy: Path | None = typer.Option(None, "--policy", help="Policy TOML (defaults: docs/policy.md)."),
    junit: Path | None = typer.Option(None, "--junit", help="Write JUnit XML here (one case per check)."),
    report_dir: Path | None = typer.Option(None, "--report-dir", help="Write gate-summary.md and gate-decision.json here."),
    as_json: bool = typer.Option(False, "--json", help="Print the decision as JSON."),
    registry_url: str | None = typer.Option(None, "--registry", envvar="TIERGATE_REGISTRY_URL",
                                            help="Record runs and the decision in this registry."),
    base_image: str | None = typer.Option(None, "--base-image", help="Base image for runtime images."),
    ca_bundle: Path | None = typer.Option(None, "--ca-bundle", help="Extra CA bundle for builds behind a proxy."),
    max_parallel: int = typer.Option(2, "--max-parallel", min=1, help="Containers running at a time."),
    shards: int | None = typer.Option(None, "--shards", min=1, help="Split each tier's samples over N containers "
                                      "(merged in sample order; default: the class's [evaluation] shards, "
                                      "automatic on emulated classes). Never changes the decision."),
    early_stop: bool | None = typer.Option(None, "--early-stop/--no-early-stop",
                                           help="Decide each tier at the first look (a growing share of the "
                                                "samples) whose verdict is settled, alpha spent across looks "
                                                "(docs/policy.md, early_looks); default: the policy's early_stop, "
                                                "off."),
    profile: bool = typer.Option(False, "--profile", help="Also record per-op time (op type and node) per run."),
    explain: bool = typer.Option(False, "--explain", help="On REJECT, name the first divergent layer per tier "
                                 "(tiergate explain; the cached decision is unchanged)."),
) -> None:
    """Gate a candidate: PROMOTE (exit 0), REJECT (exit 1) or INCONCLUSIVE (exit 3), every check listed."""
    from tiergate import quickgate
    from tiergate.cli.gate_output import prepare
    from tiergate.reports.gate_files import write_reports

    request = prepare(candidate, reference, data, targets, incumbent=incumbent, policy=policy, junit=junit,
                      report_dir=report_dir, metric=metric, sample_axis=sample_axis, base_image=base_image,
                      ca_bundle=ca_bundle, profile=profile, early_stop=early_stop)
    device_classes, loaded_policy = list(request.device_classes), request.policy
    err = Console(stderr=True)
    progress = None if as_json else (lambda text: err.print(f"[dim]… {text}[/]", highlight=False))
    # an unchanged request is answered from the decision cache before anything heavy is imported (no fast
    # path with a registry: recording needs the normal path's runs)
    run = quickgate.lookup(request) if not registry_url else None
    if run is not None:
        if progress is not None:
            progress("unchanged: the decision from the cache (nothing loaded, built or run)")
    else:
        run = _gate(request, registry_url, max_parallel, shards, progress)
    write_reports(run, report_dir, junit)
    explained = _explain(run, candidate, reference, data, device_classes, loaded_policy, base_image, ca_bundle,
                         progress) if explain else None
    if as_json:
        typer.echo(json_text(run, explained))
    else:
        print_run(run, explained)
    raise typer.Exit(run.decision.exit_code)


def _gate(request, registry_url: str | None, max_parallel: int, shards: int | None, progress):
    """The normal path: intake, build, run (or reuse), decide; then remember it for the fast path."""
    from tiergate import pipeline, quickgate
    from tiergate.evaldata import parse_sample_axes

    if threading.current_thread() is threading.main_thread():
        from tiergate.execution import janitor

        janitor.install_signal_handlers()
    registry = _registry(registry_url)
    seams = pipeline.Seams()
    builder = seams.builder = quickgate.Recorder(seams.builder or pipeline.DockerBuilder(request.base_image,
                                                                                         request.ca_bundle))
    run = pipeline.gate(request.candidate, request.reference, request.data, list(request.device_classes),
                        request.policy, incumbent=request.incumbent, base_image=request.base_image,
                        ca_bundle=request.ca_bundle, registry=registry, max_parallel=max_parallel,
                        progress=progress, profile=request.profile, shards=shards, early_stop=request.early_stop,
                        sample_axes=parse_sample_axes(list(request.sample_axes)), metrics=list(request.metrics),
                        seams=seams)
    if registry is not None:
        pipeline.record_or_reuse(registry, run)
    else:
        quickgate.remember(request, run, builder)
    return run


def _registry(url: str | None):
    if not url:
        return None
    from tiergate.registry import Registry

    return Registry(url)


def _explain(run, candidate, reference, data, device_classes, policy, base_image, ca_bundle, progress):
    """After a REJECT: tiergate explain on the same tiers (never part of the cached decision)."""
    if run.decision.verdict != "REJECT":
        return None
    from tiergate.errors import TiergateError
    from tiergate.execution.explain import DockerRunner, explain
    from tiergate.explain import Explanation, TierExplain

    try:
        return explain(candidate, reference, data, device_classes, policy, runner=DockerRunner(base_image, ca_bundle),
                       progress=progress)
    except TiergateError as exc:       # the verdict stands; say why no layer could be named
        return Explanation(str(candidate), str(reference),
                           {dc.name: TierExplain(dc.name, 0.0, error=exc.one_line()) for dc in device_classes})


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
