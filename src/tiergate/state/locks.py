"""Key locks (one fcntl lock per key under locks/: one run or decision of a key at a time) and the probes gc
makes of them and of a writer's process."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tiergate.paths import home
from tiergate.state.names import LOCKS


@contextmanager
def key_lock(key: str) -> Iterator[None]:
    """An exclusive lock on one key for this process's thread and every other process (fcntl)."""
    path = home() / LOCKS / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THREAD_LOCKS_GUARD:
        thread_lock = _THREAD_LOCKS.setdefault(key, threading.Lock())
    with thread_lock, open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


@contextmanager
def try_key_lock(key: str, root: Path | None = None) -> Iterator[bool]:
    """The key's lock if nobody holds it (yields True), else yields False at once."""
    path = (root or home()) / LOCKS / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def flock_held(path: Path) -> bool:
    """Whether another open file holds an flock on `path` (a key_lock); never blocks."""
    try:      # never through a link, never blocking on a FIFO planted in a shared folder (the lease folder)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases our probe lock
    return False


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True
