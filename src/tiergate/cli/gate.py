"""`tiergate gate`: run the candidate and its FP32 reference on every device class, then decide.

Exit 0 PROMOTE, 1 REJECT, 2 unusable input or environment, 3 INCONCLUSIVE.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tiergate.errors import EnvironmentProblem, InputError

_OK = {True: "[green]pass[/]", False: "[bold red]FAIL[/]"}


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
    max_parallel: int = typer.Option(2, "--max-parallel", min=1, help="Target runs at a time."),
    profile: bool = typer.Option(False, "--profile", help="Also record per-op time (op type and node) per run."),
    explain: bool = typer.Option(False, "--explain", help="On REJECT, name the first divergent layer per tier "
                                 "(tiergate explain; the cached decision is unchanged)."),
) -> None:
    """Gate a candidate: PROMOTE (exit 0), REJECT (exit 1) or INCONCLUSIVE (exit 3), every check listed."""
    from tiergate import quickgate
    from tiergate.policy import load_policy
    from tiergate.reports.gate_files import write_reports
    from tiergate.targets import catalogue, resolve

    device_classes = resolve(targets)
    loaded_policy = load_policy(policy)
    loaded_policy.check_override_names(list(catalogue().values()))
    if report_dir is not None:
        writable_folder(report_dir, "--report-dir")
    if junit is not None:
        if junit.is_dir():
            raise InputError(f"--junit {junit}: is a folder; give a file name")
        writable_folder(junit.parent, "--junit")
    err = Console(stderr=True)
    progress = None if as_json else (lambda text: err.print(f"[dim]… {text}[/]", highlight=False))
    request = quickgate.Request(candidate, reference, data, tuple(device_classes), loaded_policy, incumbent=incumbent,
                                metrics=tuple(metric), sample_axes=tuple(sample_axis), base_image=base_image,
                                ca_bundle=ca_bundle, profile=profile)
    # an unchanged request is answered from the decision cache before anything heavy is imported (no fast
    # path with a registry: recording needs the normal path's runs)
    run = quickgate.lookup(request) if not registry_url else None
    if run is not None:
        if progress is not None:
            progress("unchanged: the decision from the cache (nothing loaded, built or run)")
    else:
        run = _gate(request, registry_url, max_parallel, progress)
    write_reports(run, report_dir, junit)
    explained = _explain(run, candidate, reference, data, device_classes, loaded_policy, base_image, ca_bundle,
                         progress) if explain else None
    if as_json:
        doc = run.decision.to_json()
        doc["runs"] = {f"{role}/{dc}": str(path) for (role, dc), path in run.run_dirs.items()}
        doc["cache_hits"], doc["containers_started"] = run.cache_hits, run.containers_started
        doc["decision_cached"] = run.decision_cached
        doc["runtime"] = run.runtime
        doc["findings"] = {dc: [f.to_json() for f in found] for dc, found in run.runtime_findings.items()}
        if explained is not None:
            doc["reasons"] = doc["reasons"] + [f"explain: {line}" for line in explained.reasons()]
            doc["explain"] = explained.to_json()
        typer.echo(json.dumps(doc, indent=1))
    else:
        _print(run, explained)
    raise typer.Exit(run.decision.exit_code)


def _gate(request, registry_url: str | None, max_parallel: int, progress):
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
                        progress=progress, profile=request.profile,
                        sample_axes=parse_sample_axes(list(request.sample_axes)), metrics=list(request.metrics),
                        seams=seams)
    if registry is not None:
        pipeline.record_or_reuse(registry, run)
    else:
        quickgate.remember(request, run, builder)
    return run


def writable_folder(folder: Path, option: str) -> None:
    """Make sure a report can be written there before anything runs (else the verdict would be lost)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".tiergate-probe-"):
            pass
    except OSError as exc:
        raise EnvironmentProblem(f"{option} {folder}: cannot write there ({exc.strerror or exc})") from None


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


def _print(run, explained=None) -> None:
    decision = run.decision
    table = Table(title=f"tiergate gate: {decision.verdict}")
    for column in ("device class", "tier", "check", "value", "interval", "threshold", "result"):
        table.add_column(column, overflow="fold")
    for c in decision.checks:
        threshold = "" if c.threshold is None else f"{c.op} {_fmt(c.threshold)}"
        interval = "" if c.interval is None else f"[{_fmt(c.interval.low)}, {_fmt(c.interval.high)}]"
        result = "[yellow]INCONCLUSIVE[/]" if c.inconclusive else _OK[c.passed]
        table.add_row(c.device_class, c.tier, c.label, _fmt(c.value), interval, threshold, result)
    console = Console(width=max(Console().width, 120))
    console.print(table)
    _print_device(console, decision)
    _print_runtime(console, run)
    for reason in decision.reasons:
        console.print(f"[red]reason:[/] {reason}", highlight=False)
    for warning in decision.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    for line in explained.reasons() if explained is not None else []:
        console.print(f"[red]reason:[/] explain: {line}", highlight=False)
    for name, files in run.report_files.items():
        console.print(f"{name}: {files}", highlight=False)
    console.print(f"runs: {run.containers_started} started, {run.cache_hits} reused from cache", highlight=False)
    style = "bold green" if decision.passed else ("bold yellow" if decision.verdict == "INCONCLUSIVE" else "bold red")
    console.print(f"[{style}]{decision.verdict}[/]")


def _print_device(console: Console, decision) -> None:
    """The device figures of every run, candidate and reference, and the top ops where profiled."""
    from tiergate.reports.device import device_rows

    rows = device_rows(decision)
    if not rows:
        return
    table = Table(title="device figures (emulated: QEMU, memory includes the emulator; not gated)")
    for column in ("device class", "run", "peak MB", "load +MB", "infer +MB", "load ms", "first call ms",
                   "size MB", "top ops (ms/call)"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["device_class"] + (" (emulated)" if r["emulated"] else ""), r["side"], *r["cells"],
                      r["top_ops"])
    console.print(table)


def _print_runtime(console: Console, run) -> None:
    """What each tier's runtime executes of the candidate: the most frequent ops, and lint findings on it."""
    summary = run.runtime_summary()
    if not summary:
        return
    table = Table(title="runtime graph of the candidate (what each tier executes)")
    for column in ("device class", "level", "nodes", "top ops", "placement"):
        table.add_column(column, overflow="fold")
    for name, item in summary.items():
        if not item["ok"]:
            table.add_row(name, "", "", f"[red]refused: {item['error']}[/]", "")
            continue
        ops = sorted(item["ops"].items(), key=lambda kv: -kv[1])
        table.add_row(name, item["level"] or "-", str(sum(item["ops"].values())),
                      ", ".join(f"{op} {n}" for op, n in ops[:6]),
                      ", ".join(f"{k} {v}" for k, v in item["placement"].items()))
    console.print(table)
    for name, found in run.runtime_findings.items():
        for f in found:
            if f.severity != "info":
                console.print(f"[yellow]{f.severity}[/] {name}: {f.rule}: {f.message}", highlight=False)


def _fmt(value) -> str:
    from tiergate.fmt import number

    return number(value, 4)


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
