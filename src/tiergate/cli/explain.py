"""`tiergate explain`: which layer lost it, on which tier; optionally the candidates that fix it, gated A/B.

Exit 0 when explained (with --fix, when some fix passes on every tier; with --mixed-precision, when the
mixed-precision candidate passes the gate), 1 when none does, 2 on unusable input or environment.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table


def explain(
    candidate: Path = typer.Option(..., "--candidate", "-c", help="The quantized artifact (ONNX or TFLite), a file or "
                                   "an MLflow models:/NAME/VERSION or models:/NAME@ALIAS."),
    reference: Path = typer.Option(..., "--reference", "-r", help="Its FP32 reference, same format (a file or a "
                                   "models:/ URI)."),
    data: str = typer.Option(..., "--data", "-d", help="The evaluation data, as the gate takes it: an .npz (one "
                             "array per model input) or a loader FILE.py:FUNCTION."),
    targets: str = typer.Option(..., "--targets", "-t", help="Device classes, comma-separated."),
    policy: Path | None = typer.Option(None, "--policy", help="Policy TOML: min_sqnr_db is the divergence threshold."),
    samples: int = typer.Option(32, "--samples", min=1, help="Samples to dump tensors for (the first N)."),
    as_json: bool = typer.Option(False, "--json", help="Print the explanation as JSON (docs/json-shapes.md)."),
    out: Path | None = typer.Option(None, "--out", help="Write explain.json, explain.md and explain.html here."),
    fix: Path | None = typer.Option(None, "--fix", help="Make the candidates that fix it (recalibrated INT8, the "
                                    "minimal float set, both), gate each A/B on every tier, write them into this "
                                    "folder (named by method) and print the table, smallest first. ONNX only."),
    mixed_precision: Path | None = typer.Option(None, "--mixed-precision",
                                                help="Write the minimal float set here and gate it A/B (--fix's "
                                                     "float set alone)."),
    calibration_data: Path | None = typer.Option(None, "--calibration-data",
                                                 help=".npz for re-quantizing (never the evaluation data unless "
                                                      "you pass the same file on purpose)."),
    base_image: str | None = typer.Option(None, "--base-image", help="Base image for runtime images."),
    ca_bundle: Path | None = typer.Option(None, "--ca-bundle", help="Extra CA bundle for builds behind a proxy."),
) -> None:
    """Locate the first divergent layer per tier; suggest what to keep in float; make and gate the fixes."""
    from tiergate.errors import InputError
    from tiergate.execution.explain import explain as run_explain
    from tiergate.explain import markdown_table
    from tiergate.policy import load_policy
    from tiergate.orchestrator.explain_ab import docker_runner
    from tiergate.request import BuildSettings
    from tiergate.targets import catalogue, resolve

    _stop_on_signals()
    _regular_inputs(data, policy, calibration_data, ca_bundle)
    candidate, reference = _local(candidate, reference)
    for option, value in (("--fix", fix), ("--mixed-precision", mixed_precision)):
        if value is not None and calibration_data is None:
            raise InputError(f"{option} needs --calibration-data (an .npz of representative inputs; "
                             "the evaluation data is never used for calibration unless you pass it here)")
    device_classes = resolve(targets)
    loaded_policy = load_policy(policy)
    loaded_policy.check_override_names(list(catalogue().values()))
    _check_outputs(candidate, reference, data, policy, calibration_data, ca_bundle, out, mixed_precision, fix)
    build = BuildSettings(base_image, ca_bundle)
    err = Console(stderr=True)
    progress = None if as_json else (lambda text: err.print(f"[dim]… {text}[/]", highlight=False))
    result = run_explain(candidate, reference, data, device_classes, loaded_policy,
                         runner=docker_runner(build), samples=samples, progress=progress)
    code = 0
    if fix is not None or mixed_precision is not None:
        from tiergate.orchestrator import DockerBuilder, RunOptions, Seams
        from tiergate.orchestrator.explain_fix import find_fixes, mixed_precision_ab
        from tiergate.request import GateRequest

        request = GateRequest(candidate, reference, data, tuple(device_classes), loaded_policy)
        seams, options = Seams(builder=DockerBuilder(build)), RunOptions(progress=progress)
        report = None
        if fix is not None:
            report = find_fixes(result, request, calibration_data, fix, seams, options)
            result.fixes = report.to_json()
            code = 0 if report.passing or report.candidate.passes else 1
        if mixed_precision is not None:
            result.mixed_precision = mixed_precision_ab(result, request, calibration_data, mixed_precision, seams,
                                                        options, report=report)
            mixed = result.mixed_precision["mixed"]
            passed = result.mixed_precision["int8"]["passes_against_reference"] if mixed is None else \
                mixed["verdict"] == "PROMOTE"
            code = code if fix is not None else (0 if passed else 1)
    if out is not None:
        from tiergate.reports.explain_html import write_html

        from tiergate.paths import write_new

        out.mkdir(parents=True, exist_ok=True)
        write_new(out / "explain.json", result.dumps())
        write_new(out / "explain.md", markdown_table(result))
        write_html(result, out / "explain.html")
    if as_json:
        typer.echo(result.dumps())
    else:
        print_explanation(Console(width=max(Console().width, 120)), result)
        if out is not None:
            Console().print(f"report: {out / 'explain.html'}", highlight=False)
    raise typer.Exit(code)


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM stop explain as they stop a gate (execution.janitor): its containers and volumes removed,
    its part folders gone, one line and exit 130/143."""
    import threading

    if threading.current_thread() is threading.main_thread():
        from tiergate.execution import janitor

        janitor.install_signal_handlers()


def _regular_inputs(data, policy, calibration_data, ca_bundle) -> None:
    """Every input file is a regular file (a FIFO would hang the first read, a device never ends)."""
    from tiergate.cli.gate_output import input_files
    from tiergate.paths import check_regular

    for what, path in input_files({"data": data, "policy": policy, "calibration_data": calibration_data,
                                   "ca_bundle": ca_bundle}):
        check_regular(path, what)


def _local(candidate: Path, reference: Path) -> tuple[Path, Path]:
    """The candidate and reference as local files (a models:/ URI fetched from MLflow, as the gate does); the
    reference FP32 (artifact.precision.check_reference: explain measures the candidate's losses against it)."""
    from tiergate.artifact import load_artifact
    from tiergate.artifact.precision import check_reference
    from tiergate.mlflow_bridge import local_artifact

    candidate, reference = local_artifact(candidate), local_artifact(reference, "reference")
    check_reference(load_artifact(reference))
    return candidate, reference


def _check_outputs(candidate, reference, data, policy, calibration_data, ca_bundle, out, mixed_precision,
                   fix) -> None:
    """Before any work: --out's files, the --mixed-precision model and --fix's files are no input, not in the
    home and not one another (paths.check_outputs); --mixed-precision and --fix need ONNX artifacts."""
    from tiergate.cli.gate_output import artifact_parts, input_files
    from tiergate.paths import check_outputs

    values = {"candidate": candidate, "reference": reference, "data": data, "policy": policy,
              "calibration_data": calibration_data, "ca_bundle": ca_bundle}
    inputs = input_files(values)
    outputs = [("--out", Path(out) / name) for name in ("explain.json", "explain.md", "explain.html")] if out else []
    folders = [("--out", Path(out))] if out else []
    if mixed_precision is not None:
        from tiergate.orchestrator.explain_ab import check_mixed_precision

        check_mixed_precision(candidate, reference, mixed_precision, inputs)
        outputs.append(("--mixed-precision", Path(mixed_precision)))
    if fix is not None:
        from tiergate.orchestrator.explain_fix import check_fix, fix_files

        check_fix(candidate, reference, fix, inputs)
        outputs += [("--fix", path) for path in fix_files(fix)]
        folders.append(("--fix", Path(fix)))
    if outputs:
        check_outputs(outputs, inputs, artifacts=[("candidate", candidate), ("reference", reference)],
                      parts=artifact_parts, folders=folders)


def print_explanation(console: Console, result, n: int = 5) -> None:
    """The worst layers per tier, the first divergent one, the suggestions."""
    from tiergate.explain import branch_lines, skipped_lines, unpaired_lines

    for name, item in result.targets.items():
        if item.error:
            console.print(f"[red]{name}: explain failed:[/] {item.error}", highlight=False)
            continue
        first = item.first_divergent
        title = (f"{name}: first divergent layer [bold red]{first}[/]" if first else
                 f"{name}: no layer below {item.threshold_db:g} dB")
        table = Table(title=f"{title} ({item.seconds:.1f} s)")
        for column in ("tensor", "op", "SQNR dB", "cosine", "max abs err", "saturation"):
            table.add_column(column, overflow="fold")
        for layer in item.worst(n):
            sat = "" if layer.saturation is None else f"{layer.saturation:.1%}"
            style = "bold red" if layer.tensor == first else ""
            table.add_row(layer.tensor, layer.op, f"{layer.sqnr_db:.1f}", f"{layer.cosine:.4f}",
                          f"{layer.max_abs_error:.4g}", sat, style=style)
        console.print(table)
        if item.keep_float:
            console.print(f"keep in float: {', '.join(item.keep_float)}", highlight=False)
        for hint in item.calibration:
            console.print(f"[yellow]calibration:[/] {hint}", highlight=False)
        for line in branch_lines(item) + skipped_lines(item):    # Ifs specialized, what stays in subgraphs
            console.print(line, highlight=False, markup=False)
        for line in unpaired_lines(item):         # what stays unpaired, a reason per tensor
            console.print(line, highlight=False, markup=False)
    mixed = result.mixed_precision
    if mixed:
        table = Table(title="INT8 vs mixed precision (gated on the same tiers)")
        for column in ("candidate", "verdict", "size", "kept in float", "latency (real tiers)"):
            table.add_column(column, overflow="fold")
        for key in ("int8", "mixed"):
            item = mixed[key]
            if item is None:
                continue
            latency = ", ".join(f"{dc} {ms:.3f} ms" for dc, ms in item["latency_ms"].items()) or "emulated only"
            table.add_row(item["path"], item["verdict"], f"{item['size_bytes']:,} B",
                          ", ".join(item.get("excluded", [])) or "-", latency)
        console.print(table)
        if mixed.get("note"):
            console.print(f"mixed precision: {mixed['note']}", highlight=False)
        for reason in (mixed["mixed"] or {}).get("reasons", []):
            console.print(f"[red]mixed precision reason:[/] {reason}", highlight=False)
    if result.fixes:
        print_fixes(console, result.fixes)


def print_fixes(console: Console, doc: dict) -> None:
    """explain --fix's table: the INT8 candidate, then the fixes smallest first."""
    from tiergate.explain.fixes import FixReport, notes, rows

    report = FixReport.from_json(doc)
    header, cells = rows(report)
    table = Table(title=f"Candidates that fix it, smallest first ({report.gates_run} gates; calibration data "
                        f"{report.calibration_data})")
    for column in header:
        table.add_column(column, overflow="fold")
    for row, fix in zip(cells, [report.candidate, *report.fixes]):
        table.add_row(*row, style="green" if fix.passes and fix is not report.candidate else "")
    console.print(table)
    for note in notes(report):
        console.print(f"note: {note}", highlight=False)
    best = report.passing[0] if report.passing else None
    if best is not None:
        console.print(f"[bold green]smallest fix that passes:[/] {best.name} ({best.path})", highlight=False)
    elif report.candidate.passes:
        console.print("[bold green]the INT8 candidate passes on every tier: nothing to fix[/]", highlight=False)
    else:
        console.print("[bold red]no fix passes on every tier[/]", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("explain")(explain)
