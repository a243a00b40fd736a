"""What gc keeps and removes of the home: decisions, run folders, compiled libraries and MLflow downloads, one
`Item` each with its reason (docs/gc.md)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone

from tiergate.gc.common import short
from tiergate.gc.items import Item
from tiergate.gc.planner import Planner
from tiergate.state import RESULT_FILE, SHARDS_SUFFIX, Saved, parse_part


def decision_items(p: Planner, decisions: list[Saved]) -> Iterable[tuple[Saved, Item]]:
    unregistered: dict[str, list[Saved]] = {}
    for d in decisions:
        candidate = (d.inputs or {}).get("candidate")
        if d.inputs is not None and candidate and candidate not in p.needs.models:
            unregistered.setdefault(candidate, []).append(d)
    recent: set[str] = set()
    for group in unregistered.values():
        group.sort(key=lambda d: d.created or datetime.min.replace(tzinfo=timezone.utc), reverse=True)
        recent.update(str(d.path) for d in group[:p.keep_last])
    for d in decisions:
        candidate = (d.inputs or {}).get("candidate")
        item = Item("decision", str(d.path), d.path.name, d.size, d.created, True, "", artifact=candidate)
        if parse_part(d.path.name) is not None:
            live = p.live_part(d.path.name)
            item.remove, item.reason = (False, "being written by a gate in progress") if live else \
                (True, "partial write of a gate that is no longer running")
        elif d.path.suffix == ".pickle":
            item.reason = "pickle decision cache of an older tiergate (decisions are JSON now)"
        elif d.inputs is None:
            item.reason = "not a readable decision file"
        elif d.key in p.held:
            item.remove, item.reason = False, "pending: a gate holds its lock"
        elif candidate in p.needs.keep:
            item.remove, item.reason = False, f"candidate {short(candidate)}: {p.needs.keep[candidate]}"
        elif str(d.path) in recent:
            item.remove, item.reason = False, \
                f"one of the last {p.keep_last} decisions of unregistered candidate {short(candidate)}"
        elif candidate in p.needs.models:
            item.reason = (f"candidate {short(candidate)} of model {p.needs.models[candidate]} is not "
                           f"promoted{p.recent()}")
        else:
            item.reason = (f"unregistered candidate {short(candidate)}: "
                           + (f"older than its last {p.keep_last} decisions" if p.keep_last
                              else "--keep-last 0"))
        yield d, item


def run_item(p: Planner, run: Saved) -> Item:
    name = run.path.name
    item = Item("run", str(run.path), name, run.size, run.created, True, "", artifact=run.artifact)
    if parse_part(name) is not None:
        live = p.live_part(name)
        item.remove, item.reason = (False, "being written by a gate in progress") if live else \
            (True, "partial run of a gate that is no longer running")
    elif name in p.held or name.removesuffix(SHARDS_SUFFIX) in p.held:
        item.remove, item.reason = False, "pending: a gate holds its lock"
    elif name.endswith(SHARDS_SUFFIX):
        item.reason = "finished shards of a run that did not finish (its re-run would reuse them)"
    elif run.artifact is None:
        item.reason = f"no readable {RESULT_FILE}"
    elif run.artifact in p.needs.keep:
        item.remove, item.reason = False, f"artifact {short(run.artifact)}: {p.needs.keep[run.artifact]}"
    elif name in p.keep_runs:
        item.remove, item.reason = False, p.keep_runs[name]
    elif run.artifact in p.needs.models:
        item.reason = (f"artifact {short(run.artifact)} of model {p.needs.models[run.artifact]} is not "
                       f"promoted{p.recent()}")
    else:
        item.reason = f"unregistered artifact {short(run.artifact)}: no kept decision names this run"
    return item


def compiled_item(p: Planner, compiled: Saved, engine_known: bool) -> Item:
    name = compiled.path.name
    item = Item("compiled", str(compiled.path), name, compiled.size, compiled.created, True, "",
                artifact=compiled.artifact)
    if parse_part(name) is not None:
        live = p.live_part(name)
        item.remove, item.reason = (False, "being written by a compile in progress") if live else \
            (True, "partial compile of a gate that is no longer running")
    elif f"compile-{name}" in p.held:
        item.remove, item.reason = False, "pending: a gate holds its lock"
    elif compiled.artifact in p.needs.keep:
        item.remove, item.reason = False, f"artifact {short(compiled.artifact)}: {p.needs.keep[compiled.artifact]}"
    elif name in p.staying_compiles:
        item.remove, item.reason = False, f"kept image {p.staying_compiles[name]} was built from it"
    elif not engine_known:
        item.remove, item.reason = False, "the engine's images were not looked at: one may be built from it"
    else:
        item.reason = "compiled library no kept image was built from (a gate that needs it compiles it again)"
    return item


def mlflow_item(p: Planner, download: Saved) -> Item:
    name = download.path.name
    item = Item("mlflow", str(download.path), name, download.size, download.created, True,
                "a model version downloaded from MLflow (fetched again when a gate names it)",
                artifact=download.artifact)
    if parse_part(name) is not None:
        live = p.live_part(name)
        item.remove, item.reason = (False, "being downloaded by a gate in progress") if live else \
            (True, "partial download of a gate that is no longer running")
    elif download.artifact in p.needs.keep:
        item.remove = False
        item.reason = f"artifact {short(download.artifact)}: {p.needs.keep[download.artifact]}"
    return item
