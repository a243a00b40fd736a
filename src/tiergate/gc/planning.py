"""`plan()`: what gc would remove and keep, and why, each kind judged in turn (decisions first: what a kept decision
names is kept; then runs, the engine, compiled libraries, MLflow downloads)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

from tiergate import state
from tiergate.errors import InputError
from tiergate.gc.common import DEFAULT_KEEP_LAST, image_key
from tiergate.gc.engine_items import engine_items
from tiergate.gc.home_items import compiled_item, decision_items, mlflow_item, run_item
from tiergate.gc.items import Inventory, Needs, Plan
from tiergate.gc.planner import Planner
from tiergate.state import flock_held, process_alive


def plan(home: Path, needs: Needs, inventory: Inventory | None, *, keep_last: int = DEFAULT_KEEP_LAST,
         older_than: timedelta | None = None, runtime_images: bool = False, all_images: bool = False,
         now: datetime | None = None, lock_held: Callable[[Path], bool] | None = None,
         pid_alive: Callable[[int], bool] | None = None, leased: dict[str, str] | None = None) -> Plan:
    """What gc would remove and keep, and why (removes nothing). `leased`: image id or tag -> the running gate's
    lease naming it (tiergate.leases.leased()): kept, whatever else says."""
    if keep_last < 0:
        raise InputError(f"--keep-last {keep_last}: must be 0 or more")
    p = Planner(home, needs, keep_last, older_than, runtime_images, all_images, now or datetime.now(timezone.utc),
                lock_held or flock_held, pid_alive or process_alive, leased or {})
    decisions = state.saved_decisions(p.home)
    runs = state.saved_runs(p.home)
    compiles = state.saved_compiles(p.home)
    p.busy = p.busy or any(p.live_part(e.path.name) for e in [*decisions, *runs, *compiles])
    for doc, item in decision_items(p, decisions):
        p.items.append(p.aged(item))
        if not item.remove:
            inputs = doc.inputs or {}
            for run in (inputs.get("runs") or {}).values():
                p.keep_runs.setdefault(str(run).split(":", 1)[0], f"named by kept decision {doc.key[:12]}")
            for image in (inputs.get("images") or {}).values():
                if image:
                    p.keep_images.setdefault(image_key(image), f"named by kept decision {doc.key[:12]}")
    for decision in decisions:
        for image in ((decision.inputs or {}).get("images") or {}).values():
            if image:
                p.known_images.add(image_key(image))
    for run in runs:
        item = p.aged(run_item(p, run))
        p.items.append(item)
        if run.image_id:
            p.known_images.add(image_key(run.image_id))
            if not item.remove:
                p.keep_images.setdefault(image_key(run.image_id), f"used by kept run {run.path.name}")
    # Images stay "known" to this home after the runs naming them are gone (gc-images.json),
    # so an image whose removal failed or was skipped (engine down) is removed by a later gc.
    p.ledger = set(p.known_images)
    if inventory is not None:
        engine_items(p, inventory)
    for compiled in compiles:
        p.items.append(p.aged(compiled_item(p, compiled, inventory is not None)))
    for download in state.saved_mlflow(p.home):
        p.items.append(p.aged(mlflow_item(p, download)))
    p.check_protected()
    return Plan(p.items, [], p.ledger)
