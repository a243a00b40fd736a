"""`tiergate inspect` and `tiergate diff`: artifact intake on the command line.

inspect: exit 0 when clean or warnings only, 1 with error-severity findings.
diff:    exit 0 when structure, weights and quantization are all the same, 1 otherwise.
Both exit 2 for unusable input. The --json shapes are documented in docs/json-shapes.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tiergate.errors import EXIT_FAIL, EXIT_OK

JSON_VERSION = 1
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


def inspect_report(path: Path, target: str | None = None) -> tuple[dict, int]:
    """The inspect JSON document and the exit code; shared by the CLI and other callers."""
    from tiergate.artifact import load_artifact
    from tiergate.artifact.graph import precision_counts
    from tiergate.fingerprint import fingerprint
    from tiergate.lint import lint
    from tiergate.targets import resolve

    device_class = resolve(target)[0] if target else None
    artifact = load_artifact(path)
    findings = lint(artifact, device_class)
    summary = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
    report = {
        "version": JSON_VERSION,
        "artifact": _artifact_json(artifact),
        "precision": precision_counts(artifact),
        "fingerprint": fingerprint(artifact).to_json(),
        "target": device_class.name if device_class else None,
        "findings": [f.to_json() for f in findings],
        "summary": summary,
        "ok": summary["error"] == 0,
    }
    return report, EXIT_OK if report["ok"] else EXIT_FAIL


def _artifact_json(artifact) -> dict:
    def spec(t):
        return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}

    return {
        "path": str(artifact.path),
        "format": artifact.format,
        "version": artifact.version,
        "sha256": artifact.sha256,
        "size_bytes": artifact.size_bytes,
        "inputs": [spec(t) for t in artifact.inputs],
        "outputs": [spec(t) for t in artifact.outputs],
        "node_count": len(artifact.nodes),
        "op_counts": dict(sorted(artifact.op_counts.items())),
        "quantization": [
            {"tensor": q.tensor, "dtype": q.dtype, "scale": list(q.scale), "zero_point": list(q.zero_point),
             "axis": q.axis}
            for q in sorted(artifact.quant.values(), key=lambda q: q.tensor)
        ],
        "external_data": list(artifact.external_data),
    }


def inspect(
    artifact: Path = typer.Argument(..., help="ONNX or TFLite model file."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (docs/json-shapes.md)."),
    target: str = typer.Option(None, "--target", help="Device class to check op support against."),
) -> None:
    """Describe, fingerprint and lint an artifact; exit 1 when a finding is an error."""
    report, code = inspect_report(artifact, target)
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        _print_inspect(report)
    raise typer.Exit(code)


def _print_inspect(report: dict) -> None:
    console = Console()
    art, fp = report["artifact"], report["fingerprint"]
    about = Table(title=f"tiergate inspect {art['path']}", show_header=False)
    about.add_column("field", style="bold")
    about.add_column("value", overflow="fold")
    rows = [
        ("format", f"{art['format']} ({art['version']})"),
        ("size", f"{art['size_bytes']:,} bytes"),
        ("sha256", art["sha256"]),
        ("inputs", "; ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in art["inputs"])),
        ("outputs", "; ".join(f"{t['name']} {t['dtype']}{t['shape']}" for t in art["outputs"])),
        ("nodes", f"{art['node_count']}: " + ", ".join(f"{op} x{n}" for op, n in art["op_counts"].items())),
        ("precision", f"{report['precision']['quantized']} quantized, {report['precision']['float']} float nodes; "
                      f"{len(art['quantization'])} quantized tensors"),
        ("fingerprint", f"{fp['combined']} (structure {fp['structure'][:12]}, weights {fp['weights'][:12]}, "
                        f"quantization {fp['quantization'][:12]})"),
        ("target", report["target"] or "(default runtime of the format)"),
    ]
    for row in rows:
        about.add_row(*row)
    console.print(about)
    _print_findings(console, report)


def _print_findings(console: Console, report: dict) -> None:
    if not report["findings"]:
        console.print("[green]no findings[/]")
        return
    table = Table(title="findings")
    for column in ("severity", "rule", "nodes", "message"):
        table.add_column(column, overflow="fold")
    for f in report["findings"]:
        style = _SEVERITY_STYLE[f["severity"]]
        table.add_row(f"[{style}]{f['severity']}[/]", f["rule"], ", ".join(f["node_names"]), f["message"])
    console.print(table)
    s = report["summary"]
    console.print(f"{s['error']} error(s), {s['warning']} warning(s), {s['info']} info")


def diff(
    old: Path = typer.Argument(..., help="The artifact before."),
    new: Path = typer.Argument(..., help="The artifact after."),
    as_json: bool = typer.Option(False, "--json", help="Print the diff as JSON (docs/json-shapes.md)."),
) -> None:
    """Compare two artifacts node by node; exit 0 when identical, 1 when different."""
    from tiergate.artifact import load_artifact
    from tiergate.diff import diff_artifacts

    result = diff_artifacts(load_artifact(old), load_artifact(new))
    document = {"version": JSON_VERSION, "old": str(old), "new": str(new), **result.to_json()}
    if as_json:
        typer.echo(json.dumps(document, indent=1))
    else:
        _print_diff(document)
    raise typer.Exit(EXIT_OK if result.identical else EXIT_FAIL)


def _print_diff(doc: dict) -> None:
    console = Console()
    parts = ", ".join(f"{part} {'same' if same else '[bold]different[/]'}" for part, same in doc["same"].items())
    verdict = "[green]identical[/]" if doc["identical"] else "[yellow]different[/]"
    console.print(f"tiergate diff {doc['old']} -> {doc['new']}: {verdict} ({parts})")
    table = Table(title="node changes (matched by position)")
    for column in ("change", "old #", "new #", "op", "name", "detail"):
        table.add_column(column, overflow="fold")
    for n in doc["removed"]:
        table.add_row("[red]removed[/]", str(n["index"]), "", n["op"], n["name"], "")
    for n in doc["added"]:
        table.add_row("[green]added[/]", "", str(n["index"]), n["op"], n["name"], "")
    for c in doc["changed"]:
        detail = "; ".join(f"{(x['what'] + ' ' + x['key']).strip()}: {x['old']} -> {x['new']}" for x in c["changes"])
        table.add_row("changed", str(c["old_index"]), str(c["new_index"]), c["op"], c["name"], detail)
    if table.row_count:
        console.print(table)
    if doc["op_counts"]:
        counts = ", ".join(f"{op} {v['delta']:+d}" for op, v in doc["op_counts"].items())
        console.print(f"op counts: {counts}")
    p = doc["precision"]
    console.print(f"quantized/float nodes: {p['old']['quantized']}/{p['old']['float']} -> "
                  f"{p['new']['quantized']}/{p['new']['float']}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the tiergate app."""
    app.command("inspect")(inspect)
    app.command("diff")(diff)
