"""`tiergate inspect` and `tiergate diff`: artifact intake on the command line.

inspect: exit 0 when clean or warnings only, 1 with error-severity findings; several files are one call
         (the worst code of them; an unusable file among several is reported and the rest still inspected).
diff:    exit 0 when structure, weights and quantization are all the same, 1 otherwise.
Both exit 2 for unusable input. The --json shapes are documented in docs/json-shapes.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tiergate.decision import cpu_text
from tiergate.errors import EXIT_FAIL, EXIT_UNUSABLE, EXIT_OK

JSON_VERSION = 1
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "dim"}


def inspect_report(path: Path, target: str | None = None, *, runtime: bool = True,
                   policy: Path | None = None) -> tuple[dict, int]:
    """The inspect JSON document and the exit code; shared by the CLI and other callers.

    target: device class name(s), comma-separated. runtime: describe each target's runtime graph
    in its container (tiergate.execution.describe) and lint on it; False judges the file only.
    policy: a gate policy whose [outputs.NAME] tables say what outputs are (shown with what was detected)."""
    from tiergate.artifact import load_artifact
    from tiergate.artifact.graph import precision_counts
    from tiergate.fingerprint import fingerprint
    from tiergate.lint import lint
    from tiergate.outputs import resolve as output_kinds
    from tiergate.policy import load_policy
    from tiergate.mlflow_bridge import local_artifact
    from tiergate.targets import resolve

    classes = resolve(target) if target else []
    tables = load_policy(policy).outputs if policy is not None else {}
    artifact = load_artifact(local_artifact(path))
    kinds = output_kinds(artifact, tables)
    graphs, notes = runtime_graphs(artifact, classes) if runtime else ({}, [])
    findings = _merged([lint(artifact, dc, runtime=graphs.get(dc.name)) for dc in classes]
                       if classes else [lint(artifact)]) + notes
    summary = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
    report = {
        "version": JSON_VERSION,
        "artifact": _artifact_json(artifact),
        "precision": precision_counts(artifact),
        "fingerprint": fingerprint(artifact).to_json(),
        "target": classes[0].name if classes else None,
        "outputs": {name: _kind_json(kind) for name, kind in kinds.items()},
        "findings": [f.to_json() for f in findings],
        "summary": summary,
        "ok": summary["error"] == 0,
    }
    if classes:
        report["targets"] = [dc.name for dc in classes]
        report["runtime"] = {name: graph.to_json() for name, graph in graphs.items()}
    return report, EXIT_OK if report["ok"] else EXIT_FAIL


def runtime_graphs(artifact, classes) -> tuple[dict, list]:
    """Each class's RuntimeGraph (built/reused runtime image, one cached container run per tier)
    and notes for the classes that could not be described (a GPU class on a machine without one)."""
    from tiergate.build import ensure_runtime_image
    from tiergate.errors import EnvironmentProblem, TiergateError
    from tiergate.execution.describe import describe_runtime
    from tiergate.execution.engine import connect, with_retries
    from tiergate.lint import Finding

    graphs, notes = {}, []
    for dc in classes:
        if dc.artifact_format != artifact.format:
            continue  # unsupported-op says this artifact cannot run there at all
        try:
            client = with_retries(lambda: connect(dc.docker_host), what=f"connecting to {dc.docker_host}")
            try:
                if dc.gpu and "nvidia" not in (client.info().get("Runtimes") or {}):
                    raise EnvironmentProblem(f"engine {dc.docker_host} has no NVIDIA container runtime")
                if dc.compiled:
                    graph, problem = compiled_runtime_graph(artifact, dc, client)
                    if graph is not None:
                        graphs[dc.name] = graph
                    else:
                        notes.append(Finding("runtime-graph", "warning", f"{dc.name}: runtime graph not described "
                                             f"({problem}); judged on the file only", basis="runtime",
                                             target=dc.name))
                    continue
                image = ensure_runtime_image(dc, client=client)
                graphs[dc.name] = describe_runtime(artifact, dc, image.tag, client=client)
            finally:
                client.close()
        except TiergateError as exc:
            if not dc.gpu:
                raise
            notes.append(Finding("runtime-graph", "warning", f"{dc.name}: runtime graph not described "
                                 f"({exc}); judged on the file only", basis="runtime", target=dc.name))
    return graphs, notes


def compiled_runtime_graph(artifact, dc, client):
    """(graph, None): what a compiling class (tvm, ethos-u) runs of the artifact, its compile's record (TVM: the
    passes applied, each with the module's fingerprint after it; Vela: each operator's placement and the estimate),
    compiled now or found in the compile cache, at the model's own shapes (a symbolic first dimension at the class's
    batch size); a model it cannot compile is a refusal in its words. (None, why) when the model's shapes leave
    dimensions that only evaluation data fix (a gate compiles it)."""
    from tiergate.compiler import compile_shapes, compiled, compiled_graph
    from tiergate.errors import InputError
    from tiergate.runtime_graph import RuntimeGraph

    try:
        compile_shapes(dc, artifact)
    except InputError as exc:
        return None, exc.one_line()
    try:
        return compiled_graph(dc, artifact, compiled_artifact=compiled(dc, artifact, client=client)), None
    except InputError as exc:
        return RuntimeGraph(target=dc.name, tier=dc.tier, runtime=dc.runtime, machine=dc.machine,
                            emulated=dc.emulated, image="", image_id="", artifact_sha256=artifact.sha256, ok=False,
                            error=exc.one_line(),
                            versions={"ethos-u-vela" if dc.runtime == "ethos-u" else "tvm": dc.runtime_version}), None


def _merged(per_target: list[list]) -> list:
    """Findings of every target, each once (file-level ones are the same for every target)."""
    seen, merged = set(), []
    for findings in per_target:
        for f in findings:
            key = (f.rule, f.severity, f.message, f.nodes, f.basis, f.target)
            if key not in seen:
                seen.add(key)
                merged.append(f)
    return merged


def _kind_json(kind) -> dict:
    from dataclasses import asdict

    doc = asdict(kind.summary())
    doc.pop("alphabet", None)
    return doc


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
    artifacts: list[Path] = typer.Argument(..., help="ONNX or TFLite model file(s): a corpus is one call."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (docs/json-shapes.md); with "
                                                      "several files, a JSON array of one report per file."),
    as_jsonl: bool = typer.Option(False, "--jsonl", help="Print one JSON report per line, per file, as each "
                                                        "is done."),
    target: str = typer.Option(None, "--target", help="Device class(es), comma-separated: describe and lint the "
                                                      "graph each tier's runtime runs (in its container)."),
    runtime: bool = typer.Option(True, "--runtime/--no-runtime",
                                 help="With --target: describe the runtime graph in the tier's container "
                                      "(--no-runtime judges the file only, no Docker)."),
    policy: Path = typer.Option(None, "--policy", help="A gate policy: its [outputs.NAME] tables say what outputs "
                                                       "are (shown with what tiergate detected)."),
) -> None:
    """Describe, fingerprint and lint artifacts; exit 1 when a finding is an error, 2 when a file is unusable."""
    if len(artifacts) == 1 and not as_jsonl:
        report, code = inspect_report(artifacts[0], target, runtime=runtime, policy=policy)
        typer.echo(json.dumps(report, indent=1)) if as_json else _print_inspect(report)
        raise typer.Exit(code)
    reports, tally = [], {"ok": 0, "with errors": 0, "unusable": 0}
    for path in artifacts:
        report, _ = inspect_one(path, target, runtime=runtime, policy=policy)
        tally["unusable" if "error" in report else "ok" if report["ok"] else "with errors"] += 1
        if as_jsonl:
            typer.echo(json.dumps(report))
        elif as_json:
            reports.append(report)
        elif "error" in report:
            typer.echo(f"tiergate: error: {report['error']}", err=True)
        else:
            _print_inspect(report)
    if as_json:
        typer.echo(json.dumps(reports, indent=1))
    elif not as_jsonl:
        typer.echo(f"{len(artifacts)} files: " + ", ".join(f"{n} {kind}" for kind, n in tally.items()))
    raise typer.Exit(EXIT_UNUSABLE if tally["unusable"] else EXIT_FAIL if tally["with errors"] else EXIT_OK)


def inspect_one(path: Path, target: str | None = None, *, runtime: bool = True,
                policy: Path | None = None) -> tuple[dict, int]:
    """inspect_report for one file of several: an unusable file is a report with its one-line "error" (exit 2
    for it), so the other files are still inspected."""
    from tiergate.cli.main import os_error_line
    from tiergate.errors import TiergateError

    try:
        return inspect_report(path, target, runtime=runtime, policy=policy)
    except (TiergateError, OSError) as exc:     # one file's problem is its own record, never the batch's end
        error = exc.one_line() if isinstance(exc, TiergateError) else os_error_line(exc)
        return {"version": JSON_VERSION, "artifact": {"path": str(path)}, "error": error, "ok": False}, \
            EXIT_UNUSABLE


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
        ("output kinds", "\n".join(f"{name}: {_kind_text(kind)}" for name, kind in report["outputs"].items())),
        ("target", report["target"] or "(default runtime of the format)"),
    ]
    for row in rows:
        about.add_row(*row)
    console.print(about)
    for graph in report.get("runtime", {}).values():
        _print_runtime(console, graph)
    _print_findings(console, report)


def _kind_text(kind: dict) -> str:
    """An output's kind for people: the kind, its layout or alphabet, and where it came from."""
    extra = kind["layout"]
    if kind["kind"] == "ctc":
        extra = (f"alphabet of {kind['alphabet_size']} from {kind['alphabet_source']}" if kind["alphabet_size"]
                 else "no alphabet: symbol indices")
    elif kind["kind"] == "landmarks":
        extra = f"{kind['points']} points x {kind['dims']}"
    if kind.get("scores"):
        extra += f", scores in '{kind['scores']}'"
    head = kind["kind"] + (f" ({extra})" if extra else "")
    return f"{head} [{'policy' if kind['source'] == 'policy' else 'detected: ' + kind['why']}]"


def _op_list(ops: dict) -> str:
    return ", ".join(f"{op.removeprefix(':')} x{n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


def _print_runtime(console: Console, graph: dict) -> None:
    how = f"{graph['machine']}{' emulated' if graph['emulated'] else ''}, " + \
        ", ".join(f"{k} {v}" for k, v in graph["versions"].items())
    if graph.get("cpu"):
        how += f"; cpu {cpu_text(graph['cpu'])}"
    when = "cached" if graph["cached"] else f"{graph['seconds']:.1f} s"
    title = f"runtime graph on {graph['target']} (tier {graph['tier']}; {how}; {when})"
    if not graph["ok"]:
        console.print(f"[bold red]{title}: the runtime refuses the model:[/] {graph['error']}")
        return
    if "passes" in graph:
        _print_passes(console, title, graph)
        return
    if graph.get("runtime") == "ethos-u":
        from tiergate.cli.npu_table import print_placement

        print_placement(console, title, graph)
        return
    table = Table(title=title)
    placement = ", ".join(f"{ep} {n}" for ep, n in graph["placement"].items())
    if "levels" in graph:
        for column in ("level", "nodes", "fingerprint", "ops"):
            table.add_column(column, overflow="fold")
        for name, level in graph["levels"].items():
            mark = " (runs)" if name == graph["default_level"] else ""
            table.add_row(name + mark, str(level["node_count"]), level["fingerprint"]["combined"], _op_list(level["ops"]))
        table.caption = f"placement: {placement}"
    else:
        for column in ("ops", "placement"):
            table.add_column(column, overflow="fold")
        table.add_row(_op_list(graph["ops"]), placement)
    console.print(table)


def _print_passes(console: Console, title: str, graph: dict) -> None:
    """A compiled artifact's graph: its compile, and the passes that changed the module (--json lists every one)."""
    from tiergate.runtime_graph import changed_passes

    record, passes = graph["compile"], graph["passes"]
    changed = changed_passes(passes)
    target = json.dumps(record.get("target", {}), sort_keys=True)
    table = Table(title=title, caption=f"{len(passes)} passes applied, {len(changed)} changed the module; target "
                                       f"{target}, opt level {record.get('opt_level')}, compiled in "
                                       f"{record.get('compile_seconds', 0):.1f} s")
    for column in ("#", "pass that changed the module", "fingerprint after it"):
        table.add_column(column, overflow="fold")
    index = {id(p): i for i, p in enumerate(passes)}
    for p in changed[:40]:
        table.add_row(str(index[id(p)]), p["name"], p["fingerprint"])
    if len(changed) > 40:
        table.add_row("...", f"{len(changed) - 40} more (--json)", "")
    console.print(table)


def _print_findings(console: Console, report: dict) -> None:
    if not report["findings"]:
        console.print("[green]no findings[/]")
        return
    table = Table(title="findings")
    for column in ("severity", "rule", "on"):
        table.add_column(column, no_wrap=True)
    table.add_column("nodes", overflow="fold", max_width=30)
    table.add_column("message", overflow="fold", ratio=1, min_width=30)
    for f in report["findings"]:
        style = _SEVERITY_STYLE[f["severity"]]
        on = f["target"] if f["basis"] == "runtime" else "file"
        names = ", ".join(f["node_names"][:6]) + (f" (+{len(f['node_names']) - 6})" if len(f["node_names"]) > 6 else "")
        # escaped: a runtime finding starts with "[tier: level]", which rich would take for markup and drop
        table.add_row(f"[{style}]{f['severity']}[/]", f["rule"], on, escape(names), escape(f["message"]))
    console.print(table)
    s = report["summary"]
    console.print(f"{s['error']} error(s), {s['warning']} warning(s), {s['info']} info")


def diff(
    old: Path = typer.Argument(..., help="The artifact before."),
    new: Path = typer.Argument(..., help="The artifact after."),
    as_json: bool = typer.Option(False, "--json", help="Print the diff as JSON (docs/json-shapes.md)."),
    target: str = typer.Option(None, "--target", help="Device class(es), comma-separated: also compare the graphs "
                                                      "each tier's runtime makes, level by level (a compiling "
                                                      "class: pass by pass)."),
    new_disable_pass: list[str] = typer.Option([], "--new-disable-pass",
                                               help="With --target: the new side's toolchain has this pass switched "
                                                    "off (repeatable; tiergate gate --disable-pass). Two toolchain "
                                                    "configurations of one artifact: diff A A --target T "
                                                    "--new-disable-pass NAME."),
) -> None:
    """Compare two artifacts node by node; exit 0 when identical, 1 when different."""
    from tiergate.artifact import load_artifact
    from tiergate.diff import diff_artifacts
    from tiergate.errors import InputError
    from tiergate.request import disabled_passes

    if new_disable_pass and not target:
        raise InputError("--new-disable-pass compares two toolchain configurations on a tier: give --target")
    from tiergate.mlflow_bridge import local_artifact

    a, b = load_artifact(local_artifact(old)), load_artifact(local_artifact(new))
    result = diff_artifacts(a, b)
    document = {"version": JSON_VERSION, "old": str(old), "new": str(new), **result.to_json()}
    off = disabled_passes(new_disable_pass)
    if target:
        document["runtime"] = runtime_diff(a, b, target, off)
    if off:
        document["new_disabled_passes"] = list(off)
        same_everywhere = all(rt["first_difference"] is None for rt in document["runtime"].values())
        code = EXIT_OK if result.identical and same_everywhere else EXIT_FAIL
    else:
        code = EXIT_OK if result.identical else EXIT_FAIL
    if as_json:
        typer.echo(json.dumps(document, indent=1))
    else:
        _print_diff(document)
    raise typer.Exit(code)


def runtime_diff(old, new, target: str, new_disabled: tuple[str, ...] = ()) -> dict:
    """Per target: the first optimization level (a compiling class: the first pass) at which the two runtime
    graphs differ, and per level which fingerprint parts are the same and the op-count deltas. `new_disabled`: the
    passes the new side's toolchain has switched off."""
    import dataclasses

    from tiergate.runtime_graph import first_difference, level_differences
    from tiergate.targets import resolve

    classes = resolve(target)
    changed = [dataclasses.replace(dc, disabled_passes=tuple(sorted({*dc.disabled_passes, *new_disabled})))
               for dc in classes]
    graphs_old, _ = runtime_graphs(old, classes)
    graphs_new, _ = runtime_graphs(new, changed)
    out = {}
    for name in graphs_old.keys() & graphs_new.keys():
        a, b = graphs_old[name], graphs_new[name]
        out[name] = {"first_difference": first_difference(a, b), "levels": level_differences(a, b),
                     "ok": {"old": a.ok, "new": b.ok}}
        if a.npu and b.npu:         # an NPU class: which operators moved (docs/npu.md)
            from tiergate.npu.placement import Placement, diff as placement_diff

            out[name]["placement"] = placement_diff(Placement.from_record(a.npu), Placement.from_record(b.npu),
                                                     "the old model")
    return out


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
    for name, rt in doc.get("runtime", {}).items():
        first = rt["first_difference"]
        if first is None:
            verdict = "the same at every level"
        elif str(first).startswith("pass "):
            verdict = f"start to differ after [bold]{first}[/]"
        else:
            verdict = f"start to differ at level [bold]{first}[/]"
        console.print(f"runtime graphs on {name}: {verdict}")
        for level, d in rt["levels"].items():
            if d["op_counts"]:
                deltas = ", ".join(f"{op.removeprefix(':')} {v['delta']:+d}" for op, v in d["op_counts"].items())
                console.print(f"  {level}: {deltas}")
        if rt.get("placement"):
            from tiergate.npu.placement import diff_lines

            for line in diff_lines(rt["placement"]):
                console.print(f"  {escape(line)}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the tiergate app."""
    app.command("inspect")(inspect)
    app.command("diff")(diff)
