"""Image leases: the images running gates use, machine-wide, so that no `tiergate gc` removes one under a gate.

Images are shared by content across homes (and users of one engine), so a gate's image may be one another
home's gc sees as unneeded. A gate holds a lease for its life (`holding()`): a file pair in one directory
outside any home (`TIERGATE_LEASES_DIR`, default `<tmp>/tiergate-leases`, sticky and writable by all, like
/tmp): `<name>.lock`, which the gate process keeps flock-ed, and `<name>.json`, the image ids and tags its
gates use (rewritten whole as images are added). A lease whose lock nobody holds is stale (a killed gate):
gc removes it.

The race between a gate reusing an image and gc removing it is closed by `gc.lock` in the same folder: a gate
holds it shared from finding (or building) an image until the image is in its lease (`using_images()`); gc
holds it exclusive while it reads the leases and removes images (`excluding_gates()`). Either gc removed the
image before the gate looked (the gate builds it again), or the lease names it before gc reads the leases.

Builds are serialised in the same folder (`building(engine, tag)`): one flock-ed `build-<hash>.buildlock` per
image tag and engine, so two gates that need the same new image build it once, and the second reuses the first's
(the same image id, hence the same run keys) instead of tagging a second build of its own over it.

Stdlib only: gc and the orchestrator both read it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import tempfile
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

ENV = "TIERGATE_LEASES_DIR"
GC_LOCK = "gc.lock"
_GUARD = threading.RLock()
_STATE: dict = {"count": 0, "lease": None}


def folder() -> Path:
    """Where leases are: $TIERGATE_LEASES_DIR, else one folder in the system's temporary directory."""
    return Path(os.environ.get(ENV) or Path(tempfile.gettempdir()) / "tiergate-leases")


def _ready() -> Path:
    root = folder()
    if not root.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        if not os.environ.get(ENV):
            try:
                os.chmod(root, 0o1777)      # every user's gates lease here (the engine is shared)
            except OSError:
                pass
    return root


class _Lease:
    """This process's lease: the lock file held, the images written beside it."""

    def __init__(self, root: Path):
        name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lock_path, self.json_path = root / f"{name}.lock", root / f"{name}.json"
        self.images: set[str] = set()
        while True:      # a stale-lease sweep may unlink the file between open and flock: then take a new one
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            os.fchmod(fd, 0o644)            # whatever the umask: every user's gc probes it
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                break
            os.close(fd)
        self._write()

    def add(self, refs: Iterable[str]) -> None:
        new = {r for r in refs if r} - self.images
        if new:
            self.images |= new
            self._write()

    def _write(self) -> None:
        tmp = self.json_path.with_name(self.json_path.name + f".tmp-{uuid.uuid4().hex[:6]}")
        tmp.write_text(json.dumps({"pid": os.getpid(), "images": sorted(self.images)}))
        os.chmod(tmp, 0o644)
        tmp.replace(self.json_path)

    def release(self) -> None:
        for path in (self.json_path, self.lock_path):
            path.unlink(missing_ok=True)
        os.close(self.fd)


@contextmanager
def holding() -> Iterator[None]:
    """A lease for a gate's life (counted: concurrent gates of one process share one lease, released when the
    last ends). A folder where no lease can be written is a warning: the gate goes on unprotected."""
    with _GUARD:
        if _STATE["count"] == 0:
            try:
                _STATE["lease"] = _Lease(_ready())
            except OSError as exc:
                _STATE["lease"] = None
                print(f"tiergate: warning: cannot hold an image lease in {folder()} ({exc.strerror or exc}): "
                      f"a tiergate gc meanwhile may remove this gate's images (set {ENV})", file=sys.stderr)
        _STATE["count"] += 1
    try:
        yield
    finally:
        with _GUARD:
            _STATE["count"] -= 1
            if _STATE["count"] == 0 and _STATE["lease"] is not None:
                _STATE["lease"].release()
                _STATE["lease"] = None


def for_its_life(fn):
    """Decorate a gate: it holds a lease while it runs (`holding()`)."""
    import functools

    @functools.wraps(fn)
    def leased_call(*args, **kwargs):
        with holding():
            return fn(*args, **kwargs)
    return leased_call


def add(*refs: str | None) -> None:
    """Name images (ids, tags) this process's gates use in its lease (nothing without one: `holding()`)."""
    with _GUARD:
        lease = _STATE["lease"]
        if lease is not None:
            try:
                lease.add(r for r in refs if r)
            except OSError:
                pass


@contextmanager
def _gc_lock(mode: int, waiting: str = "") -> Iterator[None]:
    with _flock(GC_LOCK, mode, waiting):
        yield


@contextmanager
def building(engine: str, tag: str) -> Iterator[None]:
    """Held (exclusive) while a process looks for the image `tag` on `engine` and builds it when it is missing:
    whoever waited looks again once it holds it. Not a lease (leased() never reads or prunes these files)."""
    digest = hashlib.sha256(f"{engine}\0{tag}".encode()).hexdigest()[:32]
    with _flock(f"build-{digest}.buildlock", fcntl.LOCK_EX, f"waiting for another process building {tag}"):
        yield


@contextmanager
def _flock(name: str, mode: int, waiting: str = "") -> Iterator[None]:
    try:
        root = _ready()
        fd = os.open(root / name, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        yield                  # no lease folder: nothing to lock against (holding() warned)
        return
    try:
        os.fchmod(fd, 0o644)   # every user's gates and gc open it (a flock needs no write access)
    except OSError:
        pass                   # another user's file
    try:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except OSError:
            if waiting:
                print(f"tiergate: {waiting}", file=sys.stderr)
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)


def using_images():
    """Held (shared) by a gate from finding or building an image until `add` named it."""
    return _gc_lock(fcntl.LOCK_SH)


def excluding_gates():
    """Held (exclusive) by gc while it reads the leases and removes images."""
    return _gc_lock(fcntl.LOCK_EX, "waiting for running gates to take up their images (they are being built)")


def leased(*, prune: bool = True) -> dict[str, str]:
    """Image id or tag -> the lease naming it, over every lease whose lock is held; stale leases are removed
    (`prune`)."""
    from tiergate.state import flock_held

    root = folder()
    found: dict[str, str] = {}
    try:
        locks = sorted(root.glob("*.lock"))
    except OSError:
        return found
    for lock in locks:
        if lock.name == GC_LOCK:
            continue
        data = lock.with_suffix(".json")
        if not flock_held(lock):
            if prune:
                for path in (data, lock):
                    try:
                        path.unlink(missing_ok=True)
                    except OSError:
                        pass
            continue
        try:
            doc = json.loads(data.read_text())
            images = [str(i) for i in doc.get("images", [])]
        except (OSError, ValueError, AttributeError, TypeError):
            continue
        for image in images:
            found.setdefault(image, f"{lock.stem} (pid {doc.get('pid', '?')})")
    return found
