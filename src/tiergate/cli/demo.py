"""`tiergate demo`: the whole job on the embedded default (digits CNN, four candidates, four tiers)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tiergate.cli.options import parameter
from tiergate.errors import EXIT_FAIL, EXIT_OK
from tiergate.request import option


def demo(
    work_dir: Path | None = typer.Option(None, "--work-dir", help="Where models, runs and the report go "
                                         "(default: $TIERGATE_HOME/demo)."),
    max_parallel: int = parameter(option("max_parallel"))[1],
) -> None:
    """Train a digits CNN, make INT8/FP16 candidates, gate each on x86 and emulated arm64, report.

    Exit 0 when every candidate got the decision it was built for (the good ones
    promoted, the broken calibration rejected, the ONNX INT8 one INCONCLUSIVE on the
    450 test images and promoted on 2,000 samples), 1 otherwise.
    """
    from tiergate.demo.job import run_demo
    from tiergate.demo.models import CANDIDATES

    console = Console(width=max(Console().width, 140))
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("candidates", total=len(CANDIDATES) + 1)   # + the confirmation on more samples
        step = bar.add_task("starting", total=None)
        seen = []

        def on_candidate(candidate):
            if seen:
                bar.advance(task)
            seen.append(candidate.name)
            bar.update(task, description=f"candidate {candidate.name}")

        started = time.monotonic()

        def on_first(candidate, decision):      # the native tiers' verdict, minutes after starting
            tiers = ", ".join(decision.metrics)
            bar.console.print(f"first verdict ({time.monotonic() - started:.0f} s): {candidate.name} on {tiers}: "
                              f"{decision.verdict} (the emulated tiers follow)", highlight=False)

        outcome = run_demo(work_dir, progress=lambda text: bar.update(step, description=text),
                           on_candidate=on_candidate, max_parallel=max_parallel, on_first=on_first)
        bar.advance(task)
        bar.update(step, description="done", total=1, completed=1)
    console.print(verdict_table(outcome))
    for item in outcome.outcomes:
        for reason in item.decision.reasons[:4]:
            console.print(f"[red]{item.candidate.name}:[/] {reason}", highlight=False)
    console.print(f"drift report: {outcome.report_html}\n             {outcome.report_json}", highlight=False)
    if outcome.explained is not None:       # the badly calibrated candidate: which layer, its fixes
        from tiergate.cli.explain import print_explanation

        print_explanation(console, outcome.explained)
        console.print(f"explain report: {outcome.explain_html} ({outcome.explain_seconds:.0f} s)", highlight=False)
    if outcome.as_expected:
        console.print("[bold green]every candidate got the decision it was built for[/]")
        raise typer.Exit(EXIT_OK)
    console.print("[bold red]a candidate did not get the decision it was built for[/]")
    raise typer.Exit(EXIT_FAIL)


def verdict_table(outcome) -> Table:
    table = Table(title="tiergate demo: verdict per candidate and device tier")
    for column in ("candidate", "device class (tier)", "accuracy", "drift vs FP32", "latency p50",
                   "cost / 1k", "decision"):
        table.add_column(column, overflow="fold")
    for item in outcome.outcomes:
        for name, m in item.decision.metrics.items():
            table.add_row(item.candidate.name + (f"\nA/B vs {item.incumbent}" if item.incumbent else "")
                          + (f"\non the {item.data_note}" if item.data_note else ""),
                          f"{name}\n({m.tier})", _accuracy(m), _drift(m), _latency(m),
                          _cost(m), _decision(item.decision, name))
        table.add_section()
    return table


def _accuracy(m) -> str:
    acc, ref = m.accuracy.get("candidate"), m.accuracy.get("reference")
    if acc is None:
        return "n/a"
    return (f"{acc.value:.2%} [{acc.low:.1%}, {acc.high:.1%}]"
            + (f"\n(FP32 {ref.value:.2%} [{ref.low:.1%}, {ref.high:.1%}])" if ref else ""))


def _drift(m) -> str:
    drift = m.outputs.get(m.label_output) or next(iter(m.outputs.values()), None)
    if drift is None:
        return "n/a"
    return f"cos {drift.cosine:.4f}\nSQNR {drift.sqnr_db:.1f} dB"


def _latency(m) -> str:
    lat = m.latency.get("candidate")
    if lat is None:
        return "n/a"
    label = "emulated" if lat.emulated else "native"
    return f"{lat.p50_ms:.3f} ms ({label})"


def _cost(m) -> str:
    cost = m.cost_per_1k.get("candidate")
    if m.emulated:
        return "n/a (emulated)"
    return "n/a" if cost is None else f"${cost:.2e}"


def _decision(decision, device_class: str) -> str:
    mine = [c for c in decision.checks if c.device_class == device_class and not c.passed]
    failed = [c.label for c in mine if not c.inconclusive]
    open_ = [c for c in mine if c.inconclusive]
    parts = [f"[red]fail[/]: {', '.join(failed)}"] if failed else []
    for check in open_:
        interval = check.interval
        needed = f"needs ~{check.samples_needed} samples" if check.samples_needed else "no sample size decides"
        parts.append(f"[yellow]inconclusive[/]: {check.label} {interval.estimate:.3f} "
                     f"[{interval.low:.3f}, {interval.high:.3f}] vs {check.op} {check.threshold}, "
                     f"n={_samples(decision, device_class)}, {needed}")
    return "\n".join(parts or ["[green]pass[/]"]) + f" ({decision.verdict})"


def _samples(decision, device_class: str) -> str:
    m = decision.metrics.get(device_class)
    n = {t.n for t in m.task.values()} if m else set()
    return str(n.pop()) if len(n) == 1 else "?"


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
