"""`apply()`: what a plan removes, removed in a safe order (containers, volumes, decisions, runs, compiled libraries,
MLflow downloads, images), each failure recorded on its item."""

from __future__ import annotations

import shutil
from pathlib import Path

from tiergate import state
from tiergate.gc.common import APPLY_ORDER, image_key, write_ledger
from tiergate.gc.items import Engine, Item, Plan


def apply(plan: Plan, home: Path, engine: Engine | None) -> Plan:
    """Remove what the plan removes; each failure is recorded on its item, never raised."""
    order = {kind: n for n, kind in enumerate(APPLY_ORDER)}
    for item in sorted(plan.removals, key=lambda i: order[i.kind]):
        try:
            if item.kind in ("run", "decision", "compiled", "mlflow"):
                _remove_file(Path(item.id), home, item)
            elif engine is None:
                continue
            elif item.kind == "container":
                engine.remove_container(item.id)
            elif item.kind == "volume":
                engine.remove_volume(item.name)
            elif item.kind == "image":
                for ref in item.refs or (item.id,):
                    engine.remove_image(ref)
            item.removed = item.error is None
        except Exception as exc:  # noqa: BLE001 - one failure never stops the rest
            item.error = " ".join(str(exc).split())[:300] or type(exc).__name__
    removed = {image_key(i.id) for i in plan.items if i.kind == "image" and i.removed}
    write_ledger(home, plan.ledger - removed)
    return plan


def _remove_file(path: Path, home: Path, item: Item) -> None:
    root = home.resolve()
    if root not in path.resolve().parents:
        raise AssertionError(f"{path} is not under {root}")
    if item.kind == "run":
        item.error = state.remove_run(path, home)
    elif item.kind == "compiled":
        item.error = state.remove_compiled(path, home)
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
