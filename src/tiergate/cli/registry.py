"""CLI commands: `tiergate register` (store and record an artifact) and `tiergate report` (drift report)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

_REGISTRY_HELP = "SQLAlchemy URL of the registry (default: $TIERGATE_REGISTRY_URL or sqlite:///$TIERGATE_HOME/registry.db)."
_STORE_HELP = "Artifact store folder or fsspec URL (default: $TIERGATE_STORE or $TIERGATE_HOME/store)."


def _open(registry_url: str | None, store: str | None):
    from tiergate.registry import Registry

    return Registry(registry_url, store)


def register_command(
    artifact: Path = typer.Argument(..., help="The model file (ONNX or TFLite) to register."),
    model: str = typer.Option(..., "--model", help="Model name: letters, digits, '.', '_', '-'."),
    reference: Path = typer.Option(..., "--reference", help="The FP32 reference model (registered too)."),
    parent: str | None = typer.Option(None, "--parent", help="sha256 (or unique prefix) of the parent artifact."),
    tag: list[str] = typer.Option([], "--tag", help="Free-form KEY=VALUE tag; repeat for more."),
    config: Path | None = typer.Option(None, "--config", help="Compiler/quantizer configuration file (its hash is kept)."),
    registry_url: str | None = typer.Option(None, "--registry", help=_REGISTRY_HELP),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
) -> None:
    """Store an artifact content-addressed, record it with its FP32 reference, emit a Prefect event."""
    from tiergate.registry import register_artifact
    from tiergate.registry.masking import masked
    from tiergate.registry.names import model_name, tags as parse_tags

    model_name(model)
    tags = parse_tags(tag)
    with _open(registry_url, store) as registry:
        done = register_artifact(registry, artifact, model=model, reference=reference, parent=parent,
                                 tags=tags, config=config)
        where = masked(registry.store.url(done.artifact.store_key))
    from tiergate.orchestration.events import EVENT, emit_registered

    event = emit_registered(done.artifact, done.reference)
    if as_json:
        typer.echo(json.dumps({"sha256": done.artifact.sha256, "model": model, "format": done.artifact.format,
                               "precision": done.artifact.precision, "reference_sha": done.reference.sha256,
                               "parent_sha": done.artifact.parent_sha, "tags": done.artifact.tags,
                               "stored_at": where, "event": event}, indent=1))
        return
    a = done.artifact
    typer.echo(f"registered {a.sha256} as {model} ({a.format}, {a.precision})")
    typer.echo(f"  reference {done.reference.sha256} ({done.reference.precision})")
    typer.echo(f"  stored at {where}")
    typer.echo(f"  event {EVENT}: {event}")


def report_command(
    model: str = typer.Option(..., "--model", help="Model name to report on."),
    out: Path = typer.Option(..., "--out", help="Folder to write report.html, report.json, plotly.min.js and "
                                            "decisions/ (a page per decision) into."),
    since: str | None = typer.Option(None, "--since", help="Only artifacts registered on or after this ISO date."),
    registry_url: str | None = typer.Option(None, "--registry", help=_REGISTRY_HELP),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
) -> None:
    """Drift, accuracy, latency and cost per tier over time, and the cross-tier drift matrix (HTML + JSON)."""
    from tiergate.paths import check_outputs
    from tiergate.registry.names import model_name, since as parse_since
    from tiergate.registry.report_data import build_drift_report
    from tiergate.reports.decision_pages import FOLDER
    from tiergate.reports.html import HTML_FILE, JSON_FILE, write_report
    from tiergate.reports.interactive import PLOTLY_JS

    model_name(model)
    when = parse_since(since) if since else None
    check_outputs([("--out", out / HTML_FILE), ("--out", out / JSON_FILE), ("--out", out / PLOTLY_JS)], [],
                  folders=[("--out", out), ("--out", out / FOLDER)])
    with _open(registry_url, store) as registry:
        report = build_drift_report(registry, model, since=when)
    html_path, json_path = write_report(report, out)
    for tier, entries in (report.get("ops") or {}).items():
        for e in entries:
            profile = e["profile"]
            top = ", ".join(f"{op} {ms:.3g}" for op, ms in profile["top"]) if profile["available"] \
                else f"unavailable: {profile['reason']}"
            changed = ", ".join(f"{c['op']} {c['change_ms']:+.3g}" for c in e["changes"])
            typer.echo(f"top ops (ms/call) {tier} / {e['device_class']}{' (emulated)' if e['emulated'] else ''} "
                       f"@ {e['short']}: {top}"
                       + (f"; since {e['previous_short']}: {changed}" if e["previous_short"] and changed else ""))
    from tiergate.reports.device import instructions

    for tier, entry in (report.get("tiers") or {}).items():     # counted on emulated classes: exact, over time
        for row in entry["rows"]:
            count = row["metrics"].get("instructions_per_inference")
            if count is not None:
                typer.echo(f"instructions/call {tier} / {row['device_class']} @ {row['short']}: "
                           f"{instructions(count)}" + (f" ({row['decision']})" if row["decision"] else ""))
    typer.echo(f"wrote {html_path}")
    typer.echo(f"wrote {json_path}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the tiergate app."""
    app.command("register")(register_command)
    app.command("report")(report_command)
