"""Stopping one device class's runs once the gate no longer needs them (an early decision: another class's
REJECT is final, so the gate's verdict is settled whatever this class shows).

The orchestrator holds a `Cancel` per class; a job carries it (Job.cancel). A backend kills what it started for
the job when it is set (`on_cancel`), and checks it before it starts anything (`check`). A run cut short this way
is no result: the orchestrator raises `Cancelled` instead of recording a failure, and keeps every artifact that
finished before (spans.PendingRuns). Unlike a signal (janitor), it stops one class of one gate, not the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Cancelled(Exception):
    """A class's runs were stopped because the gate's verdict was settled elsewhere (never a user error)."""


class Cancel:
    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._stoppers: list[Callable[[], None]] = []
        self.reason = ""

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self, reason: str) -> None:
        """Stop: every registered stopper is called once (a failing one is ignored: its run ends anyway)."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            stoppers, self._stoppers = self._stoppers, []
        for stop in stoppers:
            _quietly(stop)

    def check(self) -> None:
        """Raise Cancelled once set: called before anything is started."""
        if self._event.is_set():
            raise Cancelled(self.reason)

    def on_cancel(self, stop: Callable[[], None]) -> Callable[[], None]:
        """Call `stop` when this is set (at once when it already is); returns what unregisters it."""
        with self._lock:
            if not self._event.is_set():
                self._stoppers.append(stop)
                return lambda: self._forget(stop)
        _quietly(stop)
        return lambda: None

    def _forget(self, stop: Callable[[], None]) -> None:
        with self._lock:
            if stop in self._stoppers:
                self._stoppers.remove(stop)


def _quietly(stop: Callable[[], None]) -> None:
    try:
        stop()
    except Exception:  # noqa: BLE001 - a container already gone, an engine that answers late: the run ends anyway
        pass
