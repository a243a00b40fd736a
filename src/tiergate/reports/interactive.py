"""The drift report's interactive plots (plotly), from the report's data: no network, no CDN.

The page loads plotly.js once from `PLOTLY_JS`, a file written beside report.html (`write_plotly_js`), by a
relative path, so report.html works from file:// offline. Each plot is a `<div id="plot-tier-<tier>">`
(one panel per metric, one line per artifact family (precision/format) and device class over the registered versions; a
button switches the x axis to the registration date) or `<div id="plot-cross-tier">` (the heatmap).
Hovering a point shows the version, the hash, the registration date and the value.
"""

from __future__ import annotations

from pathlib import Path

PLOTLY_JS = "plotly.min.js"
_CONFIG = {"displaylogo": False, "responsive": True}
_COLS = 4


def write_plotly_js(folder: Path) -> Path:
    """plotly.js (the installed plotly's own copy) beside the report, once: kept when it is the same."""
    from plotly.offline import get_plotlyjs

    path = Path(folder) / PLOTLY_JS
    text = get_plotlyjs()
    if not (path.is_file() and path.stat().st_size == len(text.encode()) and path.read_text() == text):
        path.write_text(text, encoding="utf-8")
    return path


def _html(figure, div_id: str) -> str:
    return figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=_CONFIG)


def _line_name(row: dict) -> str:
    """A line: the artifact family (precision/format unless tagged) on one device class."""
    return f"{row.get('family') or row['precision'] + '/' + row.get('format', '')} · {row['device_class']}"


def tier_plot(report: dict, tier: str, panels, emulation_bound, div_id: str) -> str:
    """One tier: a panel per metric, a line per (family, device class) across the versions (star: promoted)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    entry = report["tiers"][tier]
    order = [a["label"] for a in report["artifacts"]]
    rows = -(-len(panels) // _COLS)
    figure = make_subplots(rows=rows, cols=_COLS, subplot_titles=[title for _, title in panels],
                           horizontal_spacing=0.06, vertical_spacing=0.16)
    lines: dict[str, list[dict]] = {}
    for row in entry["rows"]:
        lines.setdefault(_line_name(row), []).append(row)
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    by_date, by_version = [], []
    for k, (key, title) in enumerate(panels):
        r, c = k // _COLS + 1, k % _COLS + 1
        for i, (name, members) in enumerate(lines.items()):
            points = [m for m in members if m["metrics"][key] is not None]
            if not points:
                continue
            emulated = any(m["emulated"] for m in points) and key.startswith(emulation_bound)
            figure.add_trace(go.Scatter(
                x=[m["label"] for m in points], y=[m["metrics"][key] for m in points], mode="lines+markers",
                name=name + (" (emulated)" if emulated else ""), legendgroup=name,
                showlegend=not any(t.legendgroup == name for t in figure.data),
                line={"color": colours[i % len(colours)]},
                marker={"symbol": ["star" if m["promoted"] else "circle" for m in points],
                        "size": [14 if m["promoted"] else 7 for m in points]},
                customdata=[[m["version"], m["short"], m["registered_at"], m["device_class"],
                             m["decision"] or "not gated"] for m in points],
                hovertemplate=("version %{customdata[0]}<br>hash %{customdata[1]}<br>registered %{customdata[2]}"
                               f"<br>{title}: %{{y:.6g}}<br>%{{customdata[3]}}: %{{customdata[4]}}"
                               "<extra>%{fullData.name}</extra>")), row=r, col=c)
            by_version.append([m["label"] for m in points])
            by_date.append([m["registered_at"] for m in points])
    axes = [f"xaxis{'' if i == 0 else i + 1}" for i in range(rows * _COLS)]
    as_version = {f"{a}.type": "category" for a in axes} | {f"{a}.categoryarray": order for a in axes} | \
        {f"{a}.categoryorder": "array" for a in axes}
    figure.update_xaxes(type="category", categoryorder="array", categoryarray=order, tickangle=-30)
    figure.update_layout(
        height=330 * rows + 90, margin={"l": 50, "r": 20, "t": 80, "b": 40}, hovermode="closest",
        title={"text": f"{report['model']}: tier {tier} by registered version (star: promoted)", "font": {"size": 15}},
        legend={"orientation": "h", "y": -0.08},
        updatemenus=[{"type": "buttons", "direction": "right", "x": 1.0, "xanchor": "right", "y": 1.12,
                      "buttons": [{"label": "x: version", "method": "update", "args": [{"x": by_version}, as_version]},
                                  {"label": "x: date", "method": "update",
                                   "args": [{"x": by_date}, {f"{a}.type": "date" for a in axes}]}]}])
    figure.update_annotations(font_size=12)
    return _html(figure, div_id)


def matrix_plot(cross: dict) -> str:
    """The cross-tier heatmap of max |error| between the promoted artifacts' outputs (hover: the pair, cosine)."""
    import plotly.graph_objects as go

    names = [f"{c['tier']} / {c['device_class']}" for c in cross["labels"]]
    z = cross["max_abs_error"]
    text = [["n/a" if v is None else f"{v:.2g}" for v in row] for row in z]
    cosine = [["n/a" if v is None else f"{v:.6f}" for v in row] for row in cross["cosine"]]
    figure = go.Figure(go.Heatmap(
        z=z, x=names, y=names, text=text, texttemplate="%{text}", customdata=cosine, colorscale="Viridis",
        colorbar={"title": {"text": "max |error|"}},
        hovertemplate="%{y}<br>vs %{x}<br>max |error| %{z:.3g}<br>cosine %{customdata}<extra></extra>"))
    side = 160 + 110 * len(names)
    figure.update_layout(title="cross-tier drift of the promoted artifacts", height=side, width=side + 260,
                         margin={"l": 40, "r": 20, "t": 60, "b": 40})
    figure.update_yaxes(autorange="reversed")
    return _html(figure, "plot-cross-tier")
