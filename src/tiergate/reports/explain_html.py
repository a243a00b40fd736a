"""The explain report as one self-contained HTML page: SQNR by layer, one line per tier, the first
divergent layer marked (matplotlib SVG inline, like the drift report), and each tier's worst layers."""

from __future__ import annotations

from html import escape
from pathlib import Path

from tiergate.explain import Explanation, branch_lines, skipped_lines
from tiergate.reports.svg import svg_text

_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td.l,th.l{text-align:left}"
          "tr.first td{background:#fdd;font-weight:bold}tr.pass td{background:#dfd}"
          "figure{margin:0}figure svg{max-width:100%;height:auto}"
          ".note{color:#666;font-size:0.9em}")


def sqnr_figure(result: Explanation) -> str:
    """SQNR (dB) by layer in the reference's topological order; one line per tier; threshold dashed."""
    from matplotlib.figure import Figure

    names: list[str] = []
    for item in result.targets.values():
        names += [layer.tensor for layer in item.layers if layer.tensor not in names]
    figure = Figure(figsize=(max(6.0, min(16.0, 0.35 * len(names) + 3)), 4.2))
    ax = figure.add_subplot()
    threshold = None
    for name, item in result.targets.items():
        if item.error or not item.layers:
            continue
        xs = [names.index(layer.tensor) for layer in item.layers]
        ys = [min(layer.sqnr_db, 100.0) for layer in item.layers]
        line, = ax.plot(xs, ys, marker=".", label=name)
        threshold = item.threshold_db
        if item.first_divergent is not None:
            k = names.index(item.first_divergent)
            layer = next(x for x in item.layers if x.tensor == item.first_divergent)
            ax.plot([k], [layer.sqnr_db], marker="o", markersize=11, fillstyle="none", color=line.get_color())
            ax.annotate(f"first divergent on {name}", (k, layer.sqnr_db), textcoords="offset points",
                        xytext=(6, -14), fontsize=8, color=line.get_color())
    if threshold is not None:
        ax.axhline(threshold, linestyle="--", color="grey", linewidth=1, label=f"threshold {threshold:g} dB")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names if len(names) <= 60 else [""] * len(names), rotation=70, fontsize=7, ha="right")
    ax.set_ylabel("SQNR vs FP32 (dB, capped at 100)")
    ax.set_xlabel("FP32 tensor (topological order)")
    ax.legend(fontsize=8)
    return svg_text(figure, "plot-explain-sqnr")


def render_html(result: Explanation, n: int = 10, *, nav: str = "") -> str:
    """The page; `nav` is HTML put above the title (the drift report's links back to it)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>tiergate explain</title>"
             f"<style>{_STYLE}</style></head><body>{nav}<h1>Which layer, on which tier</h1>",
             f"<p class='note'>candidate {escape(result.candidate)} against FP32 reference "
             f"{escape(result.reference)}</p><figure>{sqnr_figure(result)}</figure>"]
    for name, item in result.targets.items():
        parts.append(f"<h2 id='tier-{escape(name)}'>{escape(name)}</h2>")
        if item.error:
            parts.append(f"<p>explain failed: {escape(item.error)}</p>")
            continue
        first = item.first_divergent
        parts.append(f"<p>first divergent: <b>{escape(first)}</b></p>" if first else
                     f"<p>no layer below {item.threshold_db:g} dB</p>")
        parts.append("<table><tr><th class='l'>tensor</th><th class='l'>op</th><th>SQNR dB</th><th>cosine</th>"
                     "<th>max abs err</th><th>saturation</th></tr>")
        for layer in item.worst(n):
            sat = "" if layer.saturation is None else f"{layer.saturation:.1%}"
            cls = " class='first'" if layer.tensor == first else ""
            parts.append(f"<tr{cls}><td class='l'>{escape(layer.tensor)}</td><td class='l'>{escape(layer.op)}</td>"
                         f"<td>{layer.sqnr_db:.1f}</td><td>{layer.cosine:.4f}</td><td>{layer.max_abs_error:.4g}</td>"
                         f"<td>{sat}</td></tr>")
        parts.append("</table>")
        if item.keep_float:
            parts.append(f"<p>keep in float: {escape(', '.join(item.keep_float))}</p>")
        parts += [f"<p>calibration: {escape(hint)}</p>" for hint in item.calibration]
        parts += [f"<p class='note'>{escape(line)}</p>" for line in branch_lines(item) + skipped_lines(item)]
    mixed = result.mixed_precision
    if mixed:
        parts.append("<h2>INT8 vs mixed precision</h2><table><tr><th class='l'>candidate</th><th class='l'>verdict"
                     "</th><th>size (bytes)</th><th class='l'>kept in float</th><th class='l'>latency, real tiers"
                     "</th></tr>")
        for key in ("int8", "mixed"):
            side = mixed[key]
            if side is None:
                continue
            latency = ", ".join(f"{dc} {ms:.3f} ms" for dc, ms in side["latency_ms"].items()) or "emulated only"
            parts.append(f"<tr><td class='l'>{escape(side['path'])}</td><td class='l'>{escape(side['verdict'])}</td>"
                         f"<td>{side['size_bytes']:,}</td><td class='l'>{escape(', '.join(side['excluded']) or '-')}"
                         f"</td><td class='l'>{escape(latency)}</td></tr>")
        parts.append("</table>")
    if result.fixes:
        parts.append(fixes_html(result.fixes))
    return "".join(parts) + "</body></html>\n"


def fixes_html(doc: dict) -> str:
    """explain --fix's table (the INT8 candidate, then the fixes smallest first), from the JSON under "fixes"."""
    from tiergate.explain.fixes import FixReport, notes, rows

    report = FixReport.from_json(doc)
    header, cells = rows(report)
    parts = [f"<h2 id='fixes'>Candidates that fix it, smallest first</h2><p class='note'>calibration data "
             f"{escape(report.calibration_data)}; each gated against the FP32 reference with the INT8 candidate as "
             f"incumbent; {report.gates_run} gates run</p><table><tr>"]
    parts += [f"<th class='l'>{escape(column)}</th>" for column in header]
    parts.append("</tr>")
    for row, fix in zip(cells, [report.candidate, *report.fixes]):
        cls = " class='pass'" if fix.passes and fix is not report.candidate else ""
        parts.append(f"<tr{cls}>" + "".join(f"<td class='l'>{escape(cell)}</td>" for cell in row) + "</tr>")
    parts.append("</table>")
    parts += [f"<p class='note'>{escape(note)}</p>" for note in notes(report)]
    return "".join(parts)


def write_html(result: Explanation, path: Path) -> Path:
    from tiergate.paths import write_new

    write_new(path, render_html(result))             # whole, never through a link planted there
    return path
