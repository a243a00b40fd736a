"""The planner's state: `Planner`, a gc run's settings and books and the judgements every kind of item shares
(home_items.py and engine_items.py judge each kind; planning.py runs them in order)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from tiergate import state
from tiergate.gc.common import GRACE, image_key, read_ledger, span
from tiergate.gc.items import ImageInfo, Item, Needs
from tiergate.state import parse_part


class Planner:
    """A gc run's settings, what it has decided so far (the items, what kept things name) and the judgements every
    kind of item shares: a lease, an age, a live writer, the promoted aliases' safety net."""

    def __init__(self, home: Path, needs: Needs, keep_last: int, older_than: timedelta | None,
                 runtime_images: bool, all_images: bool, now: datetime, lock_held, pid_alive, leased: dict[str, str]):
        self.home, self.needs, self.keep_last = home, needs, keep_last
        self.leased = {**leased, **{image_key(ref): why for ref, why in leased.items() if ":" not in ref
                                    or ref.startswith("sha256:")}}
        self.older_than, self.runtime_images, self.all_images = older_than, runtime_images, all_images
        self.now, self.pid_alive = now, pid_alive
        self.cutoff = now - older_than if older_than else None
        self.held = {p.name[:-len(".lock")] for p in state.entries(home / state.LOCKS) if p.name.endswith(".lock")
                     and lock_held(p)}
        self.busy = bool(self.held)     # set again once live .part files are seen
        self.items: list[Item] = []
        self.keep_runs: dict[str, str] = {}      # run folder name -> why
        self.keep_images: dict[str, str] = {}    # image key -> why
        self.known_images: set[str] = set(needs.images) | read_ledger(home)
        self.ledger: set[str] = set()
        self.staying_compiles: dict[str, str] = {}   # compile key -> the kept artifact image built from it

    def lease(self, image: ImageInfo) -> str:
        """Why a running gate (in any home) needs the image, or '' (its lease names its id or a tag)."""
        for ref in (image.id, image_key(image.id), *image.tags):
            if ref in self.leased:
                return f"in use by a running gate (lease {self.leased[ref]})"
        return ""

    def recent(self) -> str:
        return f" nor among its last {self.keep_last} artifacts" if self.keep_last else " (--keep-last 0)"

    # -- age and safety ----------------------------------------------------------------
    def aged(self, item: Item) -> Item:
        """A removal of something too recent becomes a keep (--older-than; a gate in progress)."""
        if not item.remove or item.created is None:
            return item
        if self.cutoff is not None and item.created > self.cutoff:
            item.remove, item.reason = False, f"newer than {span(self.older_than)} (--older-than)"
        elif self.busy and item.created > self.now - GRACE:
            item.remove, item.reason = False, "a gate is in progress and this is from the last hour"
        return item

    def live_part(self, name: str) -> bool:
        part = parse_part(name)
        if part is None:
            return False
        return part[0] in self.held or self.pid_alive(part[1])

    def check_protected(self) -> None:
        for item in self.items:
            if item.remove and item.artifact in self.needs.protected and parse_part(item.name) is None:
                raise AssertionError(f"gc planned to remove {item.kind} {item.name}, which a promoted alias needs")
