"""The drift report's per-decision pages, from the report's data (report["decisions"], report["explanations"]).

`decisions/decision-<id>.html`: the decision's verdict, reasons, every check, the runs it used and the
artifact's lineage (its parents, its FP32 reference, its tags: MLflow lineage tags included).
`decisions/explain-<id>.html`: the explanation recorded for it (gate --explain, the demo), rendered by
tiergate.reports.explain_html from `tiergate.explain.Explanation.from_json`.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

FOLDER = "decisions"
_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1300px}
table{border-collapse:collapse;margin:0.5em 0 1.5em;width:100%}
th,td{border:1px solid #ccc;padding:0.25em 0.5em;text-align:left;font-size:0.9em;overflow-wrap:anywhere;vertical-align:top}
th{background:#f0f0f0}tr.fail td{background:#fbe3e6}tr.inconclusive td{background:#fff6d6}
.verdict-promote{color:#006400}.verdict-reject{color:#b00020}.verdict-inconclusive{color:#8a6d00}
dl{display:grid;grid-template-columns:max-content 1fr;gap:0.2em 1em}dt{font-weight:bold}dd{margin:0}
code{overflow-wrap:anywhere}.note{color:#666;font-size:0.9em}
"""


def decision_page_name(decision_id: int) -> str:
    return f"{FOLDER}/decision-{int(decision_id)}.html"


def explain_page_name(decision_id: int) -> str:
    return f"{FOLDER}/explain-{int(decision_id)}.html"


def _value(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _tags(tags: dict) -> str:
    return ", ".join(f"{escape(str(k))}={escape(str(v))}" for k, v in sorted((tags or {}).items())) or "—"


def render_decision(report: dict, decision: dict) -> str:
    """One decision's page (links are relative to the decisions/ folder)."""
    did, verdict = decision["id"], decision["verdict"]
    title = f"decision {did}: {verdict.upper()} — {escape(report['model'])} {escape(decision['label'])}"
    explain = (f'<p><a id="explain-link" href="explain-{did}.html">Which layer, on which tier: the explain table</a>'
               "</p>" if decision["explained"] else "")
    checks = "".join(
        f'<tr class="{escape(c["outcome"])}"><td>{escape(c["tier"] or "")}</td><td>{escape(c["device_class"] or "")}</td>'
        f'<td><code>{escape(c["label"])}</code></td><td>{escape(_value(c["value"]))}</td><td>{escape(c["op"] or "")}</td>'
        f'<td>{escape(_value(c["threshold"]))}</td><td class="outcome">{escape(c["outcome"])}</td>'
        f'<td>{escape(c["detail"])}</td></tr>' for c in decision["checks"])
    lineage = "".join(
        f'<tr><td>{escape(a["version"] or "—")}</td><td><code>{escape(a["sha256"])}</code></td>'
        f'<td>{escape(a["precision"])}/{escape(a["format"])}</td><td>{escape(a["registered_at"])}</td>'
        f'<td>{_tags(a["tags"])}</td></tr>' for a in decision["lineage"])
    ref = decision["reference"]
    reference = ("—" if ref is None else
                 f'<code>{escape(ref["sha256"])}</code> ({escape(ref["precision"])}/{escape(ref["format"])}'
                 f'{", " + escape(ref["version"]) if ref.get("version") else ""})')
    reasons = "".join(f"<li>{escape(r)}</li>" for r in decision["reasons"]) or "<li>—</li>"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style></head><body>"
            '<p><a id="back" href="../report.html#verdicts">← the drift report</a></p>'
            f'<h1>Decision {did}: <span id="verdict" class="verdict-{escape(verdict)}">{escape(verdict.upper())}'
            f"</span></h1>{explain}<dl>"
            f'<dt>artifact</dt><dd>{escape(decision["label"])} · {escape(decision["family"])} · '
            f'<code id="artifact-sha">{escape(decision["artifact_sha"])}</code></dd>'
            f'<dt>tiers</dt><dd>{escape(", ".join(decision["tiers"]))}</dd>'
            f'<dt>decided</dt><dd>{escape(decision["decided_at"])}</dd>'
            f"<dt>FP32 reference</dt><dd>{reference}</dd>"
            f'<dt>cost tags</dt><dd>{_tags(decision["cost_tags"])}</dd>'
            f'<dt>runs</dt><dd>{escape(", ".join(str(r) for r in decision["run_ids"])) or "—"}</dd></dl>'
            f'<h2>Reasons</h2><ul id="reasons">{reasons}</ul>'
            '<h2>Checks</h2><table id="table-checks"><tr><th>tier</th><th>device class</th><th>check</th><th>value</th>'
            f"<th>op</th><th>threshold</th><th>outcome</th><th>detail</th></tr>{checks}</table>"
            '<h2>Lineage</h2><p class="note">The artifact, then its parent, its parent\'s parent...</p>'
            '<table id="table-lineage"><tr><th>version</th><th>sha256</th><th>family</th><th>registered</th>'
            f"<th>tags</th></tr>{lineage}</table></body></html>\n")


def render_explain(decision: dict, explanation: dict) -> str:
    """The explanation recorded for a decision, on tiergate.reports.explain_html's page."""
    from tiergate.explain import Explanation
    from tiergate.reports.explain_html import render_html

    nav = (f'<p><a id="back" href="decision-{decision["id"]}.html">← decision {decision["id"]} '
           f'({escape(decision["verdict"].upper())}, {escape(decision["label"])})</a> · '
           '<a href="../report.html#verdicts">the drift report</a></p>')
    return render_html(Explanation.from_json(explanation), nav=nav)


def write_pages(report: dict, out_dir: Path) -> list[Path]:
    """Every decision's page and, where one was recorded, its explain page, under out_dir/decisions/."""
    folder = Path(out_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    explanations = report.get("explanations") or {}
    for decision in report.get("decisions") or []:
        path = Path(out_dir) / decision_page_name(decision["id"])
        path.write_text(render_decision(report, decision), encoding="utf-8")
        written.append(path)
        explanation = explanations.get(str(decision["id"]))
        if explanation is not None:
            path = Path(out_dir) / explain_page_name(decision["id"])
            path.write_text(render_explain(decision, explanation), encoding="utf-8")
            written.append(path)
    return written
