"""`tiergate gate`: run the candidate and its FP32 reference on every device class, then decide.

Exit 0 PROMOTE, 1 REJECT, 2 unusable input or environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table


_OK = {True: "[green]pass[/]", False: "[bold red]FAIL[/]"}


def gate(
    candidate: Path = typer.Option(..., "--candidate", "-c", help="The artifact to gate (ONNX or TFLite)."),
    reference: Path = typer.Option(..., "--reference", "-r", help="Its FP32 reference, same format."),
    data: Path = typer.Option(..., "--data", "-d", help=".npz: one array per model input, optional 'labels'."),
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
    explain: bool = typer.Option(False, "--explain", help="On REJECT, name the first divergent layer per tier "
                                 "(tiergate explain; the cached decision is unchanged)."),
) -> None:
    """Gate a candidate: PROMOTE (exit 0) or REJECT (exit 1) with every check listed."""
    from tiergate import pipeline
    from tiergate.policy import load_policy
    from tiergate.targets import resolve

    from tiergate.targets import catalogue

    device_classes = resolve(targets)
    loaded_policy = load_policy(policy)
    loaded_policy.check_override_names(list(catalogue().values()))
    err = Console(stderr=True)
    progress = None if as_json else (lambda text: err.print(f"[dim]… {text}[/]", highlight=False))
    registry = _registry(registry_url)
    run = pipeline.gate(candidate, reference, data, device_classes, loaded_policy, incumbent=incumbent,
                        base_image=base_image, ca_bundle=ca_bundle, registry=registry,
                        max_parallel=max_parallel, progress=progress)
    if registry is not None:
        pipeline.record_or_reuse(registry, run)
    pipeline.write_reports(run, report_dir, junit)
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


def _registry(url: str | None):
    if not url:
        return None
    from tiergate.registry import Registry

    return Registry(url)


def _explain(run, candidate, reference, data, device_classes, policy, base_image, ca_bundle, progress):
    """After a REJECT: tiergate explain on the same tiers (never part of the cached decision)."""
    if run.decision.passed:
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
    for column in ("device class", "tier", "check", "value", "threshold", "result"):
        table.add_column(column, overflow="fold")
    for c in decision.checks:
        threshold = "" if c.threshold is None else f"{c.op} {_fmt(c.threshold)}"
        table.add_row(c.device_class, c.tier, c.label, _fmt(c.value), threshold, _OK[c.passed])
    console = Console(width=max(Console().width, 120))
    console.print(table)
    _print_runtime(console, run)
    for reason in decision.reasons:
        console.print(f"[red]reason:[/] {reason}", highlight=False)
    for line in explained.reasons() if explained is not None else []:
        console.print(f"[red]reason:[/] explain: {line}", highlight=False)
    for name, files in run.report_files.items():
        console.print(f"{name}: {files}", highlight=False)
    console.print(f"runs: {run.containers_started} started, {run.cache_hits} reused from cache", highlight=False)
    style = "bold green" if decision.passed else "bold red"
    console.print(f"[{style}]{decision.verdict}[/]")


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
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
