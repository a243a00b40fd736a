"""The files `tiergate gate` writes for CD: the report folder (summary + decision JSON) and JUnit XML.

On the gate's result (`decision.GateRun`, from the orchestrator or the decision cache's fast answer in
tiergate.quickgate): `.decision`, `.runtime` (device class -> the candidate's runtime graph JSON)
and `.report_files`. Stdlib only, like the decision types it renders (the attestation's signing is given:
tiergate.attest).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tiergate.decision import cpu_text, runtime_summary


def decision_text(decision, lineage: dict | None = None) -> str:
    """gate-decision.json's text: the decision's canonical JSON, with the artifacts' `lineage` (where they came
    from: MLflow's identity, docs/json-shapes.md) when there is one. Its sha256 is the decision's sha256 everywhere
    it is named: MLflow's `tiergate.decision_sha256` tag and the signed attestation's predicate."""
    if not lineage:
        return decision.dumps() + "\n"
    return json.dumps(decision.to_json() | {"lineage": lineage}, indent=1, sort_keys=True, allow_nan=False) + "\n"


def decision_sha256(decision, lineage: dict | None = None) -> str:
    """The sha256 of gate-decision.json's text (`decision_text`), whether or not the file is written."""
    return hashlib.sha256(decision_text(decision, lineage).encode()).hexdigest()


def write_reports(gate_run, report_dir: Path | None, junit: Path | None, lineage: dict | None = None,
                  attest=None) -> dict[str, Path]:
    """decision.json, summary.md (and JUnit XML) for CD, and the signed attestation (`attest`: a
    tiergate.attest.Attestation, or None); returns what was written."""
    from tiergate.reports.junit import write_junit
    from tiergate.reports.markdown import write_summary

    written: dict[str, Path] = {}
    if report_dir is not None:
        extra = runtime_markdown(runtime_summary(gate_run.runtime)) if gate_run.runtime else ""
        written.update(write_summary(gate_run.decision, report_dir, extra_markdown=extra,
                                     json_text=decision_text(gate_run.decision, lineage)))
    if junit is not None:
        written["junit"] = write_junit(gate_run.decision, junit)
    if attest is not None:
        written["attestation"] = attest.write(gate_run, lineage)
    gate_run.report_files = written
    return written


def runtime_markdown(summary: dict[str, dict]) -> str:
    """Op counts of the candidate's runtime graph per tier, side by side (Markdown)."""
    names = list(summary)
    ops = sorted({op for item in summary.values() for op in item["ops"]})
    lines = ["", "### What each tier's runtime executes (candidate, optimized graph)", "",
             "| op | " + " | ".join(f"`{n}` ({summary[n]['level'] or 'as loaded'})" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    lines += [f"| `{op}` | " + " | ".join(str(summary[n]["ops"].get(op, "")) for n in names) + " |" for op in ops]
    lines += ["", "CPU each tier's runtime saw: " + "; ".join(f"`{n}` {cpu_text(summary[n].get('cpu', {}))}"
                                                           for n in names if summary[n].get("cpu"))] \
        if any(summary[n].get("cpu") for n in names) else []
    refused = [f"- `{n}`: refused by the runtime: {summary[n]['error']}" for n in names if not summary[n]["ok"]]
    compiled = [f"- `{n}`: compiled (TVM): {p['count']} passes applied, {len(p['changed'])} changed the module, final "
                f"fingerprint `{p['final']}`" for n in names if (p := summary[n].get("passes"))]
    npu = [f"- `{n}`: NPU (Vela {p.get('vela_version', '')}, {p.get('accelerator', '')}): {p.get('npu_ops')} of "
           f"{p.get('counted')} operators on the NPU, {p.get('cpu_ops')} on the CPU"
           + "".join(f"; {c}" for c in p.get("cpu", []))
           + (f"; estimated {p['estimated_us']:.1f} us" if p.get("estimated_us") is not None else "; no NPU work")
           for n in names if (p := summary[n].get("npu"))]
    return "\n".join(lines + [""] + refused + compiled + npu) + "\n"
