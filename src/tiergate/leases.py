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

The folder is trusted only when another local user cannot have planted or be able to tamper with it
(`check_folder`): a real folder (no link) owned by this user (made sticky when others may write it), or by root and
sticky (like /tmp) or writable by root alone. Any other is refused: a gate then warns and runs without a lease, and
gc removes no image (it cannot know what running gates use). Files in it are opened without following links
(O_NOFOLLOW) and without blocking (a planted FIFO), created new (O_EXCL) where this process writes, and never
chmod-ed unless this process made them: a link planted as `gc.lock` cannot make a signing key world-readable.

Stdlib only: gc and the orchestrator both read it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
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


class FolderRefused(OSError):
    """The lease folder may have been planted or tampered with by another local user: not used."""


_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def check_folder(root: Path) -> None:
    """FolderRefused unless `root` is a real folder owned by this user, or by root and sticky (or writable by root
    alone). A folder of this user's that others may write is made sticky (they may add files, never remove ours)."""
    info = os.lstat(root)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise FolderRefused(f"{root} is {'a symbolic link' if stat.S_ISLNK(info.st_mode) else 'not a folder'}")
    mode, me = stat.S_IMODE(info.st_mode), os.geteuid()
    others_write = bool(mode & 0o022)
    sticky = bool(mode & stat.S_ISVTX)
    if info.st_uid == me:
        if others_write and not sticky:
            os.chmod(root, mode | stat.S_ISVTX, follow_symlinks=False)
        return
    if info.st_uid == 0 and (sticky or not others_write):
        return
    raise FolderRefused(f"{root} is owned by uid {info.st_uid}, neither by this user (uid {me}) nor by root with the "
                        "sticky bit: another user may have planted it, and may remove the leases in it")


def problem() -> str | None:
    """Why the lease folder is not used (one line), or None (it is there and trusted, or not made yet)."""
    try:
        check_folder(folder())
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"the image lease folder {exc.strerror or exc}" if isinstance(exc, FolderRefused) else \
            f"the image lease folder {folder()}: {exc.strerror or exc}"
    return None


def _ready() -> Path:
    root = folder()
    if not os.path.lexists(root):
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(root, 0o700)
            if not os.environ.get(ENV):
                os.chmod(root, 0o1777)      # every user's gates lease here (the engine is shared); sticky as /tmp
        except FileExistsError:
            pass                            # another process made it meanwhile: checked below like any
    check_folder(root)
    return root


def _create(path: Path) -> int:
    """A new file of this process's (never an existing one, never through a link), mode 0644 whatever the umask:
    every user's gc probes it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN, 0o644)
    os.fchmod(fd, 0o644)
    return fd


class _Lease:
    """This process's lease: the lock file held, the images written beside it."""

    def __init__(self, root: Path):
        name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lock_path, self.json_path = root / f"{name}.lock", root / f"{name}.json"
        self.images: set[str] = set()
        while True:      # a stale-lease sweep may unlink the file between open and flock: then take a new one
            try:
                fd = _create(self.lock_path)
            except FileExistsError:          # planted, or a sweep's race: another name
                name = f"{os.getpid()}-{uuid.uuid4().hex}"
                self.lock_path, self.json_path = root / f"{name}.lock", root / f"{name}.json"
                continue
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
        tmp = self.json_path.with_name(self.json_path.name + f".tmp-{uuid.uuid4().hex}")
        fd = _create(tmp)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(json.dumps({"pid": os.getpid(), "images": sorted(self.images)}))
            tmp.replace(self.json_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

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
                      f"a tiergate gc meanwhile may remove this gate's images (set {ENV} to a folder of your own)",
                      file=sys.stderr)
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


def _open_lock(path: Path) -> int:
    """A lock file to flock: made new (0644: every user's gates and gc open it; a flock needs no write access), or
    the existing one opened read-only. Never through a link, never blocking on a FIFO, never chmod-ed unless made
    here; anything but a regular file is refused (OSError)."""
    try:
        return _create(path)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | _OPEN)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FolderRefused(f"{path} is not a regular file")
    return fd


@contextmanager
def _flock(name: str, mode: int, waiting: str = "") -> Iterator[None]:
    try:
        root = _ready()
    except OSError:
        yield                  # no usable lease folder: nothing to lock against (holding() warned; gc refuses)
        return
    try:
        fd = _open_lock(root / name)
    except OSError as exc:
        if mode == fcntl.LOCK_EX and name == GC_LOCK:      # gc never removes images without excluding the gates
            from tiergate.errors import EnvironmentProblem

            raise EnvironmentProblem(f"the image lease folder: cannot take {name} ({exc.strerror or exc}); no image "
                                     "was removed", hint=f"remove a {name} that is not a regular file, or set {ENV}") \
                from None
        print(f"tiergate: warning: {name} in the image lease folder {root} is unusable ({exc.strerror or exc}); "
              "going on without it", file=sys.stderr)
        yield
        return
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
    if problem() is not None:
        return found            # never read (nor prune) a folder that is not trusted: gc refuses on problem()
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
            fd = os.open(data, os.O_RDONLY | _OPEN)
            with os.fdopen(fd, "rb") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                    continue
                doc = json.loads(handle.read(1 << 20))
            images = [str(i) for i in doc.get("images", [])]
        except (OSError, ValueError, AttributeError, TypeError):
            continue
        for image in images:
            found.setdefault(image, f"{lock.stem} (pid {doc.get('pid', '?')})")
    return found
