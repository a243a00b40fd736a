"""What `tiergate gate` checks before anything runs, and what it prints: light (rich, no typer), shared by the
typer command (cli/gate.py) and the fast path of an unchanged re-run (cli/fastgate.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tiergate.decision import cpu_text
from tiergate.paths import check_outputs, check_regular

_OK = {True: "[green]pass[/]", False: "[bold red]FAIL[/]"}


def prepare(values: dict):
    """The gate's request (tiergate.request.GateRequest) from parsed option values: device classes and policy
    loaded, report places checked writable and never an input (paths.check_outputs); unusable input raises
    before anything runs."""
    from tiergate.policy import load_policy
    from tiergate.request import request_fields
    from tiergate.targets import catalogue, resolve

    for what, path in [*input_files(values), *artifact_inputs(values)]:    # a FIFO or a device: never read
        check_regular(path, what)
    device_classes = resolve(values["targets"])
    loaded_policy = load_policy(values["policy"])
    loaded_policy.check_override_names(list(catalogue().values()))
    report_dir, junit = values["report_dir"], values["junit"]
    outputs, folders = [], []
    if report_dir is not None:
        from tiergate.reports.markdown import DECISION_FILE, SUMMARY_FILE

        folders.append(("--report-dir", Path(report_dir)))
        outputs += [("--report-dir", Path(report_dir) / name) for name in (SUMMARY_FILE, DECISION_FILE)]
    if junit is not None:
        outputs.append(("--junit", Path(junit)))
    if values.get("attest") is not None:
        outputs.append(("--attest", Path(values["attest"])))
    if outputs:
        check_outputs(outputs, input_files(values), artifacts=artifact_inputs(values), parts=artifact_parts,
                      folders=folders)
    return request_fields(values, device_classes, loaded_policy)


def attestation(values: dict, request):
    """--attest and --signing-key as a tiergate.attest.Attestation (the key loaded and checked before anything
    runs), or None when neither is given: both paths write it through reports.gate_files.write_reports."""
    if values.get("attest") is None and values.get("signing_key") is None:
        return None
    from tiergate.attest import attestation as make

    return make(values.get("attest"), values.get("signing_key"), request)


def artifact_inputs(values: dict) -> list[tuple[str, Path | None]]:
    """(role, path) of the artifacts a command reads (--candidate, --reference, --incumbent)."""
    return [(role, values.get(role)) for role in ("candidate", "reference", "incumbent")]


def input_files(values: dict) -> list[tuple[str, Path | None]]:
    """(what, path) of every other file a command reads: the data (an .npz or a loader's file), the calibration
    data, the policy, metric files, the CA bundle, the signing key."""
    from tiergate.request import is_loader, source_file as source

    found = [("evaluation data", source(values.get("data"))),
             ("calibration data", source(values.get("calibration_data"))),
             ("policy", values.get("policy")), ("CA bundle", values.get("ca_bundle")),
             ("signing key", values.get("signing_key"))]
    found += [(f"metric {spec}", source(spec)) for spec in values.get("metric") or () if is_loader(spec)]
    return found


def artifact_parts(path: Path) -> list[Path]:
    from tiergate.artifact.files import artifact_parts as parts

    return parts(path)


def json_text(run, explained=None, lineage: dict | None = None) -> str:
    """The --json document: the decision, its runs and where it came from, the candidate's runtime graphs (and
    the artifacts' `lineage` when some came from MLflow)."""
    doc = run.decision.to_json()
    if lineage:
        doc["lineage"] = lineage
    doc["runs"] = {f"{role}/{dc}": str(path) for (role, dc), path in run.run_dirs.items()}
    doc["cache_hits"], doc["containers_started"] = run.cache_hits, run.containers_started
    doc["decision_cached"] = run.decision_cached
    doc["runtime"] = run.runtime
    doc["findings"] = {dc: [f.to_json() for f in found] for dc, found in run.runtime_findings.items()}
    if explained is not None:
        doc["reasons"] = doc["reasons"] + [f"explain: {line}" for line in explained.reasons()]
        doc["explain"] = explained.to_json()
    return json.dumps(doc, indent=1)


def print_run(run, explained=None) -> None:
    """The human-readable answer: checks, device figures, runtime graphs, reasons, warnings, notes, files, runs."""
    from rich.table import Table

    decision = run.decision
    table = Table(title=f"tiergate gate: {decision.verdict}")
    for column in ("device class", "tier", "check", "value", "interval", "threshold", "result"):
        table.add_column(column, overflow="fold")
    for c in decision.checks:
        threshold = "" if c.threshold is None else f"{c.op} {_fmt(c.threshold)}"
        interval = "" if c.interval is None else f"[{_fmt(c.interval.low)}, {_fmt(c.interval.high)}]"
        result = "[yellow]INCONCLUSIVE[/]" if c.inconclusive else _OK[c.passed]
        table.add_row(c.device_class, c.tier, c.label, _fmt(c.value), interval, threshold, result)
    from tiergate.cli import screen

    console = screen.console(120)
    console.print(table)
    _print_device(console, decision)
    _print_runtime(console, run)
    for reason in decision.reasons:
        console.print(f"[red]reason:[/] {reason}", highlight=False)
    for warning in decision.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)
    from rich.markup import escape

    for note in decision.notes:
        console.print(f"[dim]note:[/] {escape(note)}", highlight=False)
    for line in explained.reasons() if explained is not None else []:
        console.print(f"[red]reason:[/] explain: {line}", highlight=False)
    for name, files in run.report_files.items():
        console.print(f"{name}: {files}", highlight=False)
    for name, t in decision.early_stop.items():
        if t.stopped_by:
            console.print(f"early stop: {name}: stopped by {t.stopped_by}'s final REJECT, undecided after "
                          f"{t.look} of {t.looks} looks, {t.samples_used} of {t.samples_total} samples judged",
                          highlight=False)
            continue
        how = (f"settled {t.verdict} at look {t.look} of {t.looks}" if t.stopped_early
               else f"{t.verdict} at its last look ({t.look} of {t.looks})")
        console.print(f"early stop: {name}: {how}, {t.samples_used} of {t.samples_total} samples used "
                      f"(intervals at {t.confidence:.4%}; seed {t.seed})", highlight=False)
    console.print(f"runs: {run.containers_started} started, {run.cache_hits} reused from cache", highlight=False)
    style = "bold green" if decision.passed else ("bold yellow" if decision.verdict == "INCONCLUSIVE" else "bold red")
    console.print(f"[{style}]{decision.verdict}[/]")


def _print_device(console, decision) -> None:
    """The device figures of every run, candidate and reference, and the top ops where profiled."""
    from tiergate.reports.device import device_rows

    rows = device_rows(decision)
    if not rows:
        return
    from rich.table import Table

    table = Table(title="device figures (emulated: QEMU, memory includes the emulator; not gated; instructions "
                        "counted under QEMU, exact, gated)")
    for column in ("device class", "run", "peak MB", "load +MB", "infer +MB", "load ms", "first call ms",
                   "size MB", "instructions/call", "load instructions", "top ops (ms/call)"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["device_class"] + (" (emulated)" if r["emulated"] else ""), r["side"], *r["cells"],
                      r["top_ops"])
    console.print(table)


def _print_runtime(console, run) -> None:
    """What each tier's runtime executes of the candidate: the most frequent ops, and lint findings on it."""
    summary = run.runtime_summary()
    if not summary:
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="runtime graph of the candidate (what each tier executes)")
    for column in ("device class", "cpu the runtime saw", "level", "nodes", "top ops", "placement"):
        table.add_column(column, overflow="fold")
    for name, item in summary.items():
        cpu = cpu_text(item.get("cpu", {}))
        if not item["ok"]:
            table.add_row(name, cpu, "", "", f"[red]refused: {item['error']}[/]", "")
            continue
        ops = sorted(item["ops"].items(), key=lambda kv: -kv[1])
        table.add_row(name, cpu, item["level"] or "-", str(sum(item["ops"].values())),
                      ", ".join(f"{op} {n}" for op, n in ops[:6]),
                      ", ".join(f"{k} {v}" for k, v in item["placement"].items()))
    console.print(table)
    for name, item in summary.items():
        if item.get("npu"):
            console.print(f"{name}: {npu_line(item['npu'])}", highlight=False)
    for name, found in run.runtime_findings.items():
        for (severity, rule, message), nodes in _grouped_findings(found):
            console.print(f"[yellow]{severity}[/] {name}: {rule}: {escape(message)}{escape(nodes)}", highlight=False)


def _grouped_findings(found) -> list[tuple[tuple[str, str, str], str]]:
    """A tier's warnings and errors, one line per message: findings that say the same of different nodes (13
    float islands of one Div each) are one line that counts them and names their first nodes."""
    groups: dict[tuple[str, str, str], list] = {}
    for f in found:
        if f.severity != "info":
            groups.setdefault((f.severity, f.rule, f.message), []).append(f)
    lines = []
    for key, same in groups.items():
        if len(same) == 1:
            lines.append((key, ""))
            continue
        names = [(f.node_names or ("?",))[0] for f in same]
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        lines.append((key, f" ({len(same)} times: {shown})"))
    return lines


def npu_line(npu: dict) -> str:
    """An NPU tier's placement and Vela's estimate in one line (docs/npu.md)."""
    share = "n/a" if npu.get("npu_op_share") is None else f"{npu['npu_op_share']:.0%}"
    time = "no NPU work" if npu.get("estimated_us") is None else \
        f"{npu['estimated_us']:.1f} us ({npu.get('cycles') or 0:.0f} cycles)"
    return (f"Vela {npu.get('vela_version', '')} on {npu.get('accelerator', '')}: {npu.get('npu_ops')} of "
            f"{npu.get('counted')} operators on the NPU ({share}), {npu.get('cpu_ops')} fall back to the CPU; "
            f"estimated {time}, the NPU's part only; SRAM {npu.get('sram_kib')} KiB, flash {npu.get('flash_kib')} KiB")


def _fmt(value) -> str:
    from tiergate.fmt import number

    return number(value, 4)
