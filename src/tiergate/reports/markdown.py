"""Markdown summary of a gate decision, for a CD job summary (e.g. $GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from pathlib import Path


from tiergate.fmt import number
from tiergate.decision import Check, Decision, DriftMatrix, TargetMetrics

SUMMARY_FILE = "gate-summary.md"
DECISION_FILE = "gate-decision.json"


def render_markdown(decision: Decision) -> str:
    """Verdict, reasons, one check table per tier, latency/cost, accuracy, A/B, cross-tier drift, notes."""
    parts = [_header(decision), _reasons(decision)]
    parts += [_tier_table(tier, checks) for tier, checks in _by_tier(decision.checks).items()]
    parts += [_latency_table(decision.metrics), _device_table(decision), _accuracy_table(decision.metrics),
              _ab_table(decision.metrics),
              _drift_section(decision.drift.get("candidate")), _notes(decision.notes)]
    return "\n\n".join(part for part in parts if part) + "\n"


def write_summary(decision: Decision, folder: str | Path, *, extra_markdown: str = "",
                  json_text: str | None = None) -> dict[str, Path]:
    """The report folder: the Markdown summary (and `extra_markdown` after it) and the decision JSON (`json_text`,
    else the decision's canonical JSON), each written whole (paths.write_new: never through a link there)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    from tiergate.paths import write_new

    written = {"markdown": folder / SUMMARY_FILE, "json": folder / DECISION_FILE}
    write_new(written["markdown"], render_markdown(decision) + extra_markdown)
    write_new(written["json"], json_text or decision.dumps() + "\n")
    return written


def _header(decision: Decision) -> str:
    icon = "✅" if decision.passed else "❌"
    failed = sum(not c.passed for c in decision.checks)
    return (f"## tiergate gate: {icon} {decision.verdict}\n\n"
            f"{len(decision.checks)} checks on {len(decision.metrics)} device classes, {failed} failed. "
            f"Candidate treated as {'quantized' if decision.quantized else 'float'}. "
            f"Policy: {', '.join(f'`{s}`' for s in decision.policy_sources)}.")


def _reasons(decision: Decision) -> str:
    if not decision.reasons:
        return ""
    return "### Why it was rejected\n\n" + "\n".join(f"- {_cell(r)}" for r in decision.reasons)


def _tier_table(tier: str, checks: list[Check]) -> str:
    rows = [[f"`{c.device_class}`", f"`{c.label}`", _num(c.value), f"{c.op} {_num(c.threshold)}",
             "✅ pass" if c.passed else "❌ **fail**", c.detail] for c in checks]
    return f"### Tier `{tier}`\n\n" + _table(["device class", "check", "value", "threshold", "result", "detail"],
                                             rows)


def _latency_table(metrics: dict[str, TargetMetrics]) -> str:
    rows = []
    for name, m in metrics.items():
        lat = m.latency.get("candidate")
        if lat is None:
            continue
        kind = "emulated (QEMU), not gated" if lat.emulated else m.execution
        p99 = _num(lat.p99_ms) + ("" if lat.p99_reliable else " (few calls)")
        cov = _num(lat.cov) + (" ⚠ unstable" if lat.unstable else "")
        rows.append([f"`{name}`", kind, str(lat.n_calls), _num(lat.p50_ms), _num(lat.p90_ms), p99, _num(lat.mean_ms),
                     cov, _num(m.latency_ratio_vs_reference), _num(m.cost_per_1k.get("candidate"))])
    if not rows:
        return ""
    head = ["device class", "execution", "calls", "p50 ms", "p90 ms", "p99 ms", "mean ms", "CoV",
            "× FP32 mean", "cost / 1k"]
    return "### Latency and cost (candidate)\n\n" + _table(head, rows)


def _device_table(decision: Decision) -> str:
    """Peak memory (and the shares of loading and inference), load, first call, size, top ops; every run."""
    from tiergate.reports.device import HEAD, device_rows, ratio_text

    rows = [[f"`{r['device_class']}`", r["side"], "emulated (QEMU), not gated" if r["emulated"] else "native",
             *r["cells"], r["top_ops"]] for r in device_rows(decision)]
    if not rows:
        return ""
    ratios = [f"- `{name}`: {ratio_text(m)}" for name, m in decision.metrics.items() if m.device_ratios]
    return ("### Device figures\n\nMB are MiB; memory is the peak resident memory of the process that runs the "
            "model (kernel VmHWM; under QEMU it includes the emulator).\n\n"
            + _table(["device class", "run", "execution", *HEAD, "top ops (ms/call)"], rows)
            + ("\n\nCandidate ratios:\n\n" + "\n".join(ratios) if ratios else ""))


def _accuracy_table(metrics: dict[str, TargetMetrics]) -> str:
    rows = [[f"`{name}`", f"`{m.label_output}`"] + [_est(m.accuracy.get(side))
                                                     for side in ("candidate", "reference", "incumbent")]
            for name, m in metrics.items() if m.accuracy]
    if not rows:
        return ""
    return "### Accuracy against labels\n\n" + _table(
        ["device class", "output", "candidate", "FP32 reference", "incumbent"], rows)


def _ab_table(metrics: dict[str, TargetMetrics]) -> str:
    rows = []
    for name, m in metrics.items():
        if not m.ab:
            continue
        diff, test, ratio = m.ab.accuracy_difference, m.ab.mcnemar, m.ab.latency_ratio
        rows.append([f"`{name}`", m.ab.correctness, f"{diff.estimate:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}]",
                     f"{test.only_a} / {test.only_b}", f"{test.p_value:.3g}",
                     "—" if ratio is None else f"{ratio.estimate:.3f} [{ratio.low:.3f}, {ratio.high:.3f}]"])
    if not rows:
        return ""
    return "### A/B against the incumbent\n\n" + _table(
        ["device class", "correctness by", "accuracy difference (CI)", "only candidate / only incumbent right",
         "McNemar exact p", "latency ratio (CI)"], rows)


def _drift_section(drift: DriftMatrix | None) -> str:
    if drift is None or len(drift.device_classes) < 2:
        return ""
    parts = ["### Cross-tier drift of the candidate (max abs error; row = taken as reference)"]
    for output in drift.outputs:
        table = drift.rows("max_abs_error", output)
        rows = [[f"`{row}`"] + [_num(v) for v in table[i]] for i, row in enumerate(drift.device_classes)]
        parts.append(f"Output `{output}`:\n\n" + _table([""] + [f"`{c}`" for c in drift.device_classes], rows))
    return "\n\n".join(parts)


def _notes(notes: list[str]) -> str:
    return "### Notes\n\n" + "\n".join(f"- {_cell(n)}" for n in notes) if notes else ""


def _by_tier(checks: list[Check]) -> dict[str, list[Check]]:
    groups: dict[str, list[Check]] = {}
    for check in checks:
        groups.setdefault(check.tier, []).append(check)
    return groups


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _num(value) -> str:
    return number(value, 4, missing="—")


def _est(est) -> str:
    return "—" if est is None else f"{est.value:.2%} [{est.low:.2%}, {est.high:.2%}]"
