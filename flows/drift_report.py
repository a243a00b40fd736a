"""The device-tier drift report on a schedule: per model, report.html + report.json from the registry.

Calls the report builder (tiergate.registry.report_data) and renderer (tiergate.reports.html);
the summary per tier shows in the Prefect UI as a Markdown artifact.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from tiergate.orchestration.gating import artifact_key
from tiergate.registry import Registry
from tiergate.registry.report_data import build_drift_report
from tiergate.reports.html import write_report


@flow(name="tiergate-drift-report", log_prints=True)
def drift_report(out_dir: str, models: list[str] | None = None, registry_url: str | None = None,
                 store: str | None = None) -> dict[str, str]:
    """Write out_dir/<model>/report.html and report.json for each model (default: every registered model)."""
    log = get_run_logger()
    written: dict[str, str] = {}
    with Registry(registry_url, store) as registry:
        for model in models or registry.models():
            report = build_drift_report(registry, model)
            html_path, _json_path = write_report(report, Path(out_dir) / model)
            written[model] = str(html_path)
            create_markdown_artifact(summary_markdown(report, html_path), key=artifact_key(f"drift-{model}"),
                                     description=f"tiergate drift report: {model}")
            log.info("drift report for %s: %d artifacts, %d tiers -> %s", model, len(report["artifacts"]),
                     len(report["tiers"]), html_path)
    return written


def summary_markdown(report: dict, html_path: Path) -> str:
    """Per tier: the promoted artifact and the latest artifact's accuracy and decision."""
    lines = [f"## tiergate drift report: `{report['model']}`", "",
             f"{len(report['artifacts'])} artifacts; full report: `{html_path}`", "",
             "| tier | device classes | promoted | runs reported | latest accuracy | latest decision |",
             "|---|---|---|---|---|---|"]
    for tier, entry in report["tiers"].items():
        latest = entry["rows"][-1] if entry["rows"] else {}
        accuracy = (latest.get("metrics") or {}).get("accuracy")
        lines.append(f"| `{tier}` | {', '.join(entry['device_classes'])} | `{report['promoted'].get(tier, '')[:12]}` "
                     f"| {len(entry['rows'])} | {'' if accuracy is None else f'{accuracy:.4f}'} "
                     f"| {latest.get('decision') or ''} |")
    return "\n".join(lines) + "\n"
