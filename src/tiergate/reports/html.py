"""The drift report: report.html (interactive plotly plots, inline CSS), report.json, and a page per decision.

A person opens report.html straight from disk; nothing is fetched from the network: plotly.js is written
once beside it (`plotly.min.js`, tiergate.reports.interactive) and loaded by a relative path. Each plot is
a `<div>` with a stable id: `plot-tier-<tier>` per tier, `plot-cross-tier` for the matrix. The verdict
matrix (`table-verdicts`: versions x tiers) links every cell to its decision's page and a REJECT with a
recorded explanation to its explain page (tiergate.reports.decision_pages, under decisions/). Tables wrap
their text to fit a 1400 px wide window. `tier_figure` / `matrix_figure` are the same plots as static
matplotlib SVG (for pages that cannot run scripts).
"""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

import numpy as np

from tiergate.decision import cpu_text
from tiergate.errors import InputError
from tiergate.reports import interactive
from tiergate.reports.decision_pages import decision_page_name, explain_page_name, write_pages
from tiergate.reports.svg import svg_text

HTML_FILE = "report.html"
JSON_FILE = "report.json"

_PANELS = (  # (metric key, panel title)
    ("cosine", "cosine vs FP32 (higher is closer)"),
    ("sqnr_db", "SQNR vs FP32 (dB)"),
    ("max_abs_error", "max |error| vs FP32"),
    ("accuracy", "accuracy"),
    ("latency_p50_ms", "latency p50 (ms)"),
    ("peak_memory_mb", "peak memory (MiB)"),
    ("load_ms", "load time (ms)"),
    ("instructions_per_inference", "guest instructions per inference (counted under QEMU)"),
    ("cost_per_1k", "cost per 1k inferences"),
)
_EMULATION_BOUND = ("latency", "peak_memory", "load", "first_inference")   # keys labelled emulated in plots
_COLUMNS = (("accuracy", "accuracy", "{:.4f}"), ("cosine", "cosine", "{:.6f}"), ("sqnr_db", "SQNR dB", "{:.1f}"),
            ("max_abs_error", "max |err|", "{:.3g}"), ("latency_p50_ms", "p50 ms", "{:.3f}"),
            ("latency_p99_ms", "p99 ms", "{:.3f}"), ("peak_memory_mb", "peak MiB", "{:.1f}"),
            ("load_ms", "load ms", "{:.3g}"), ("first_inference_ms", "1st call ms", "{:.3g}"),
            ("artifact_mb", "size MiB", "{:.3g}"), ("instructions_per_inference", "instr/call", "{:.4g}"),
            ("cost_per_1k", "cost/1k", "{:.3g}"))
_CSS = """
body{font-family:system-ui,sans-serif;margin:1em 1.2em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;max-width:100%}
table.wide{width:100%}
th,td{border:1px solid #ccc;padding:0.2em 0.35em;text-align:right;font-size:0.8em;vertical-align:top}
td.l{overflow-wrap:anywhere}td.nowrap{white-space:nowrap}
th{background:#f0f0f0}td.l,th.l{text-align:left}caption{text-align:left;font-weight:bold}
tr.promoted{background:#e8f6e8}.emulated{color:#a05a00}.reject{color:#b00020}.promote{color:#006400}
.inconclusive{color:#8a6d00}.check{display:block;font-size:0.9em;color:#444}.hash{display:block;color:#666;font-size:0.9em}
td.cell{text-align:center;min-width:7em}td.cell a{font-weight:bold;text-decoration:none}
td.verdict-promote{background:#cfeccf}td.verdict-reject{background:#f6c9cf}td.verdict-inconclusive{background:#fbeab0}
td.verdict-none{background:#eeeeee;color:#777}td.cell .check{text-align:left}a.explain-link{font-size:0.9em}
figure{margin:0}figure svg{max-width:100%;height:auto}.plot{width:100%;margin-bottom:0.5em}.note{color:#666;font-size:0.9em}
.legend span{display:inline-block;padding:0 0.5em;margin-right:0.5em;border:1px solid #ccc}
"""
_VERDICT_TEXT = {"promote": "PROMOTE", "reject": "REJECT", "inconclusive": "INCONCLUSIVE"}


def element_id(prefix: str, name: str) -> str:
    return f"{prefix}-{re.sub(r'[^A-Za-z0-9_-]', '-', name)}"


def tier_figure(report: dict, tier: str) -> str:
    """One SVG: a panel per metric, one line per device class across the artifacts in registration order."""
    from matplotlib.figure import Figure

    order = {a["sha256"]: i for i, a in enumerate(report["artifacts"])}
    rows = report["tiers"][tier]["rows"]
    figure = Figure(figsize=(14, 7.5), layout="constrained")
    axes = figure.subplots(2, 4).ravel()
    for ax, (key, title) in zip(axes, _PANELS):
        for device_class in report["tiers"][tier]["device_classes"]:
            points = [(order[r["artifact_sha"]], r["metrics"][key], r) for r in rows
                      if r["device_class"] == device_class and r["metrics"][key] is not None]
            if not points:
                continue
            emulated = any(p[2]["emulated"] for p in points)
            label = f"{device_class} (emulated)" if key.startswith(_EMULATION_BOUND) and emulated else device_class
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
            for x, y, r in points:
                if r["promoted"]:
                    ax.plot([x], [y], marker="*", markersize=14, color="gold", markeredgecolor="black")
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(report["artifacts"])), [a.get("label") or a["short"][:8] for a in report["artifacts"]],
                      rotation=45, fontsize=7)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    figure.suptitle(f"{report['model']}: tier {tier} across registered artifacts (star: promoted)")
    return svg_text(figure, element_id("static-plot-tier", tier))


def matrix_figure(cross: dict) -> str:
    """One SVG heatmap of max |error| between the promoted artifacts' outputs, tier by tier."""
    from matplotlib.figure import Figure

    names = [f"{c['tier']}\n{c['device_class']}" for c in cross["labels"]]
    values = np.array([[np.nan if v is None else v for v in row] for row in cross["max_abs_error"]], dtype=float)
    figure = Figure(figsize=(2.2 + 1.4 * len(names), 1.6 + 1.1 * len(names)), layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(values, cmap="viridis")
    figure.colorbar(image, ax=ax, label="max |error|")
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for (i, j), value in np.ndenumerate(values):
        bright = not np.isnan(value) and image.norm(value) > 0.6  # light cells (viridis yellow) get dark text
        ax.text(j, i, "n/a" if np.isnan(value) else f"{value:.2g}", ha="center", va="center", fontsize=7,
                color="black" if bright else "white")
    ax.set_title("cross-tier drift of the promoted artifacts")
    return svg_text(figure, "static-plot-cross-tier")


def _fmt(value, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)


def accuracy_text(interval: dict) -> str:
    """A proportion with its interval in percent: "93.8% [91.2, 95.9]"."""
    return f"{interval['value']:.1%} [{100 * interval['low']:.1f}, {100 * interval['high']:.1f}]"


def check_text(check: dict) -> str:
    """An interval-judged check: "accuracy_ratio[probs] 0.979 [0.887, 1.000] >= 0.99: inconclusive, needs ~231 samples"."""
    text = (f"{check['label']} {check['value']:.3f} [{check['low']:.3f}, {check['high']:.3f}] "
            f"{check['op']} {check['threshold']}: {check['outcome']}")
    if check["outcome"] == "inconclusive":
        text += f", needs ~{check['samples_needed']} samples" if check.get("samples_needed") else \
            ", no sample size decides"
    return text


def _accuracy_cell(row: dict, pattern: str) -> str:
    interval = (row.get("intervals") or {}).get("accuracy")
    if interval is None:
        return f"<td>{_fmt(row['metrics']['accuracy'], pattern)}</td>"
    return f'<td class="accuracy">{escape(accuracy_text(interval))}</td>'


def _decision_cell(row: dict) -> str:
    verdict = row["decision"] or ""
    checks = "".join(f'<span class="check {escape(c["outcome"])}">{escape(check_text(c))}</span>'
                     for c in (row.get("intervals") or {}).get("checks", []))
    text = escape(verdict)
    if row.get("decision_id") is not None:
        text = f'<a href="{decision_page_name(row["decision_id"])}">{text}</a>'
    return f'<td class="l {escape(verdict)}"><span class="verdict">{text}</span>{checks}</td>'


def tier_table(tier: str, entry: dict) -> str:
    head = "".join(f"<th>{escape(label)}</th>" for _, label, _ in _COLUMNS)
    out = [f'<table class="wide" id="{element_id("table-tier", tier)}"><tr><th class="l">version</th>'
           f'<th class="l">registered</th><th class="l">family</th><th class="l">device class</th>'
           f'<th class="l">status</th>{head}<th class="l">decision</th><th class="l">cost tags</th></tr>']
    for row in entry["rows"]:
        cells = "".join(_accuracy_cell(row, pattern) if key == "accuracy" else
                        f"<td>{_fmt(row['metrics'][key], pattern)}</td>" for key, _, pattern in _COLUMNS)
        device = escape(row["device_class"]) + (' <span class="emulated">(emulated)</span>' if row["emulated"] else "")
        tags = ", ".join(f"{escape(k)}={escape(v)}" for k, v in sorted(row["cost_tags"].items()))
        label = escape(row.get("label") or row["short"])
        out.append(f'<tr class="{"promoted" if row["promoted"] else ""}"><td class="l">{label}'
                   f'{" ★" if row["promoted"] else ""}<code class="hash" title="{row["artifact_sha"]}">{row["short"]}'
                   f'</code></td><td class="l nowrap" title="{escape(row["registered_at"])}">'
                   f'{escape(row["registered_at"][:10])}</td>'
                   f'<td class="l">{escape(row.get("family") or row["precision"])}</td><td class="l">{device}</td>'
                   f'<td class="l">{escape(row["status"])}</td>{cells}'
                   f'{_decision_cell(row)}<td class="l">{tags}</td></tr>')
    return "\n".join(out) + "</table>"


def verdict_table(report: dict) -> str:
    """Versions x tiers: each cell the verdict of the latest decision covering the tier, linked to its page
    (and, for a decision with a recorded explanation, to its explain page); grey where it was not gated."""
    matrix = report["verdicts"]
    shas = {a["sha256"]: a for a in report["artifacts"]}
    head = "".join(f'<th>{escape(tier)}</th>' for tier in matrix["tiers"])
    rows = []
    for row in matrix["rows"]:
        artifact = shas[row["artifact_sha"]]
        cells = []
        for tier in matrix["tiers"]:
            cell = row["cells"].get(tier)
            if cell is None:
                cells.append('<td class="cell verdict-none" data-verdict="none">not gated</td>')
                continue
            verdict, did = cell["verdict"], cell["decision_id"]
            failed = "".join(f'<span class="check">{escape(label)}</span>' for label in cell["failed"])
            if cell.get("stopped"):
                failed += f'<span class="check stopped" title="{escape(cell["stopped"])}">stopped, not judged</span>'
            explain = (f' <a class="explain-link" href="{explain_page_name(did)}">explain</a>'
                       if cell["explained"] else "")
            if cell.get("npu"):
                failed += f'<span class="check npu">{escape(npu_text(cell["npu"]))}</span>'

            cells.append(f'<td class="cell verdict-{escape(verdict)}" data-verdict="{escape(verdict)}" '
                         f'data-decision="{did}"><a class="verdict-link" href="{decision_page_name(did)}">'
                         f'{_VERDICT_TEXT.get(verdict, escape(verdict))}</a>{explain}{failed}</td>')
        rows.append(f'<tr><td class="l">{escape(row["label"])}</td><td class="l">{escape(row["family"])}</td>'
                    f'<td class="l"><code title="{artifact["sha256"]}">{artifact["short"]}</code></td>'
                    f'<td class="l">{escape(artifact["registered_at"][:10])}</td>{"".join(cells)}</tr>')
    legend = ('<p class="legend note"><span class="verdict-promote" style="background:#cfeccf">PROMOTE</span>'
              '<span style="background:#f6c9cf">REJECT</span><span style="background:#fbeab0">INCONCLUSIVE</span>'
              '<span style="background:#eee">not gated</span> A cell links to its decision (checks, reasons, '
              "lineage); <i>explain</i> to the layer-by-layer explanation recorded for it. Under a verdict: the "
              "checks that failed on that tier; <i>stopped, not judged</i>: an early decision stopped that tier "
              "when another tier's REJECT was final.</p>")
    return (f'{legend}<table id="table-verdicts"><tr><th class="l">version</th><th class="l">family</th>'
            f'<th class="l">hash</th><th class="l">registered</th>{head}</tr>{"".join(rows)}</table>')


def npu_text(summary: dict) -> str:
    """An NPU tier's cell: its share on the NPU and Vela's estimate."""
    share = summary.get("npu_op_share")
    time = summary.get("estimated_us")
    return (f"NPU {share:.0%}" if share is not None else "NPU n/a") + \
        f", {summary.get('cpu_ops', 0)} on CPU, " + (f"est. {time:.1f} us" if time is not None else "no NPU work")


def npu_table(rows: list[dict]) -> str:
    """NPU tiers over versions: placement share, operators on the CPU and Vela's estimate (docs/npu.md)."""
    body = []
    for r in rows:
        share = "n/a" if r["npu_op_share"] is None else f'{r["npu_op_share"]:.0%}'
        time = "no NPU work" if r["estimated_us"] is None else f'{r["estimated_us"]:.1f}'
        cpu = "; ".join(r.get("cpu") or []) or "none"
        body.append(f'<tr><td class="l">{escape(r["label"])}</td><td class="l">{escape(r["device_class"])}</td>'
                    f'<td class="verdict-{escape(r["verdict"].lower())}">{escape(r["verdict"])}</td>'
                    f'<td>{share} ({r["npu_ops"]} of {r["counted"]})</td><td>{r["cpu_ops"]}</td><td>{time}</td>'
                    f'<td>{_fmt(r["cycles"], "{:.0f}")}</td><td>{_fmt(r["sram_kib"], "{:.2f}")}</td>'
                    f'<td>{_fmt(r["flash_kib"], "{:.2f}")}</td><td class="l">{escape(cpu)}</td></tr>')
    return ('<p class="note">Vela\'s placement of each version\'s operators and its estimate of the NPU\'s part '
            "(operators on the CPU add no time to it); the float interface of an integer model is not counted. "
            "Accuracy on these tiers is LiteRT's reference kernels, never a measurement of the NPU.</p>"
            '<table id="table-npu"><tr><th class="l">version</th><th class="l">device class</th><th>verdict</th>'
            "<th>on the NPU</th><th>on the CPU</th><th>estimated us</th><th>cycles</th><th>SRAM KiB</th>"
            f'<th>flash KiB</th><th class="l">operators on the CPU</th></tr>{"".join(body)}</table>')


def matrix_table(cross: dict) -> str:
    labels = [f"{escape(c['tier'])} / {escape(c['device_class'])}" for c in cross["labels"]]
    head = "".join(f"<th>{label}</th>" for label in labels)
    rows = [f'<tr><th class="l">{label}</th>' + "".join(
        f"<td>{_fmt(err, '{:.3g}')} / {_fmt(cos, '{:.6f}')}</td>"
        for err, cos in zip(cross["max_abs_error"][i], cross["cosine"][i])) + "</tr>"
        for i, label in enumerate(labels)]
    return f'<table id="table-cross-tier"><tr><th class="l">max |err| / cosine</th>{head}</tr>{"".join(rows)}</table>'


def render_html(report: dict) -> str:
    """The report page (loads plotly.js from the file written beside it: interactive.PLOTLY_JS)."""
    title = f"tiergate drift report: {escape(report['model'])}"
    tiers = report["tiers"]
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
             f"<style>{_CSS}</style>"
             + (f'<script src="{interactive.PLOTLY_JS}"></script>' if tiers else "")
             + f"</head><body><h1>{title}</h1>",
             f'<p class="note">Generated <time id="generated-at">{escape(report["generated_at"])}</time>; '
             f'{len(report["artifacts"])} artifacts'
             f'{" registered since " + escape(report["since"]) if report["since"] else ""}. '
             "Versions: an artifact's <code>version</code> tag, else its MLflow model version, else its "
             "registration order in the model (v1, v2, ...); hover a point for its hash and date. "
             "Emulated latency, memory and load time (QEMU) are not measurements of real hardware "
             "(memory includes the emulator): compare them only with themselves.</p>"]
    parts.append("<h2>Promoted now</h2><ul>" + "".join(
        f"<li>{escape(tier)}: {escape(_label(report, sha))} <code>{sha[:12]}</code></li>"
        for tier, sha in report["promoted"].items())
        + ("" if report["promoted"] else "<li>nothing promoted yet</li>") + "</ul>")
    if (report.get("verdicts") or {}).get("rows"):
        parts.append('<h2 id="verdicts">Verdicts: versions x tiers</h2>' + verdict_table(report))
    if report.get("npu"):
        parts.append('<h2 id="npu">NPU tiers: placement and estimated time over versions</h2>' + npu_table(report["npu"]))
    for tier, entry in tiers.items():
        parts.append(f'<h2 id="{element_id("tier", tier)}">Tier {escape(tier)}</h2>')
        parts.append(f'<div class="plot">{interactive.tier_plot(report, tier, _PANELS, _EMULATION_BOUND, element_id("plot-tier", tier))}</div>')
        parts.append(tier_table(tier, entry))
    if not tiers:
        parts.append('<p class="note">No runs recorded for these artifacts.</p>')
    parts.append("<h2>Cross-tier drift of the promoted artifacts</h2>")
    cross = report["cross_tier"]
    if cross["labels"]:
        parts.append(f'<div class="plot">{interactive.matrix_plot(cross)}</div>{matrix_table(cross)}')
    else:
        parts.append('<p class="note">No promoted artifact has a stored run yet.</p>')
    ops = report.get("ops") or {}
    if ops:
        parts.append("<h2>Top ops per tier</h2>"
                     '<p class="note">Mean ms per call of the candidate\'s op types (gate --profile), latest '
                     "profiled artifact per device class, and the change since the artifact profiled before it.</p>")
        parts += [ops_table(tier, entries) for tier, entries in ops.items()]
    graphs = report.get("runtime") or []
    if graphs:
        parts.append("<h2>What each tier's runtime executes</h2>"
                     '<p class="note">Op counts of the optimized graph each device class\'s runtime runs, '
                     "produced inside its own container (latest gate of each artifact).</p>")
        parts += [runtime_table(entry) for entry in graphs[-3:]]
    parts.append("</body></html>")
    return "\n".join(parts)


def _label(report: dict, sha: str) -> str:
    return next((a["label"] for a in report["artifacts"] if a["sha256"] == sha), "")


def ops_table(tier: str, entries: list[dict]) -> str:
    """Per device class of a tier: the top ops of the latest profiled artifact and what changed since the previous."""
    rows = []
    for e in entries:
        device = escape(e["device_class"]) + (' <span class="emulated">(emulated)</span>' if e["emulated"] else "")
        if not e["profile"]["available"]:
            top = escape(f"unavailable: {e['profile']['reason']}")
        else:
            top = ", ".join(f"{escape(op)} {ms:.3g}" for op, ms in e["profile"]["top"])
        changes = ", ".join(f"{escape(c['op'])} {c['change_ms']:+.3g}" for c in e["changes"]) or "—"
        since = f"<code>{e['previous_short']}</code>" if e.get("previous_short") else "—"
        rows.append(f'<tr><td class="l">{device}</td><td class="l"><code>{e["short"]}</code></td>'
                    f'<td class="l">{top}</td><td class="l">{since}</td><td class="l">{changes}</td></tr>')
    return (f'<table id="{element_id("table-ops", tier)}"><caption>{escape(tier)}</caption><tr>'
            '<th class="l">device class</th><th class="l">artifact</th><th class="l">top ops (ms/call)</th>'
            '<th class="l">previous</th><th class="l">change (ms/call)</th></tr>' + "".join(rows) + "</table>")


def runtime_table(entry: dict) -> str:
    """One artifact's op counts per device class, side by side, under the CPU each class's runtime saw."""
    classes = entry["device_classes"]
    names = list(classes)
    ops = sorted({op for item in classes.values() for op in item.get("ops", {})})
    head = "".join(f"<th>{escape(n)}<br>{escape(classes[n].get('level') or '')}</th>" for n in names)
    rows = "".join(f'<tr><td class="l"><code>{escape(op)}</code></td>' + "".join(
        f"<td>{classes[n].get('ops', {}).get(op, '')}</td>" for n in names) + "</tr>" for op in ops)
    cpu = ('<tr><td class="l">cpu</td>' + "".join(
        f"<td>{escape(cpu_text(classes[n].get('cpu') or {}))}</td>" for n in names) + "</tr>"
        if any(classes[n].get("cpu") for n in names) else "")
    refused = ('<tr><td class="l">refused</td>' + "".join(
        f"<td>{escape(classes[n].get('error', ''))}</td>" for n in names) + "</tr>"
        if any(not classes[n].get("ok", True) for n in names) else "")
    return (f'<table id="{element_id("table-runtime", entry["short"])}"><caption><code>{escape(entry["short"])}'
            f'</code></caption><tr><th class="l">op</th>{head}</tr>{cpu}{rows}{refused}</table>')


def write_report(report: dict, out_dir: Path) -> tuple[Path, Path]:
    """Write report.html, report.json, plotly.min.js and decisions/ (a page per decision, an explain page
    per recorded explanation) into out_dir; returns the paths of report.html and report.json.

    When the folder already holds a report of the same data (only `generated_at`
    differs), it is kept as it is: the plots are the costly part and would be the same.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: --out must be a folder, and this is a file")
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path, json_path = out_dir / HTML_FILE, out_dir / JSON_FILE
    if html_path.is_file() and (out_dir / interactive.PLOTLY_JS).is_file() and _same_data(json_path, report):
        return html_path, json_path
    json_path.write_text(json.dumps(report, indent=1, sort_keys=True, allow_nan=False))
    interactive.write_plotly_js(out_dir)
    write_pages(report, out_dir)
    html_path.write_text(render_html(report), encoding="utf-8")
    return html_path, json_path


def _same_data(json_path: Path, report: dict) -> bool:
    try:
        previous = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return False
    new = json.loads(json.dumps(report, sort_keys=True, allow_nan=False))
    return {k: v for k, v in previous.items() if k != "generated_at"} == \
        {k: v for k, v in new.items() if k != "generated_at"}
