"""Files known by their stat: what the fast path does not read again while nothing about a file changed.

A stamp is a file's (device, inode, size, mtime ns, ctime ns). Any write to a file moves its ctime, which no user
call can set back, so an equal stamp means the same bytes; as git does for its index, a stamp is only believed of
a file that had been still for longer than its file system's clock tick when it was taken (`RACY_S`; `COARSE_S`
where the times are whole seconds), since a write in the same tick could keep every field; and it is taken before
and after the file was read, and kept only when both agree.

- `KnownHashes`: a file's sha256 by its stamp, kept sealed in `quick/known-files` (the fast path's hashes of
  artifacts, evaluation data and side files: a 200 MB archive is read once, not at every unchanged re-run);
- `folder_stamp`: the stamps of every file in a folder (a run folder the fast path verified in full once: an
  equal folder stamp is the same verified run, not 700 MB of outputs hashed twice again).

A run folder is stamped right after the gate wrote it. Rather than wait out a tick there, the fast path takes a
`clock_mark` first: a write of its own, stamped by the same file system's clock. A file last changed before that
mark (on the same device) cannot change again without its stamp changing, since any later write is stamped at the
mark's time or after (as git tells a racily clean entry by the index file's own time); only a file changed at or
after the mark waits out the rest of RACY_S (`believed_folder_stamp`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

from tiergate.paths import home
from tiergate.state.names import QUICK
from tiergate.state.seal import read_sealed, write_sealed

RACY_S = 0.2                  # a file still for less than this is read every time (its stamp could repeat)
COARSE_S = 2.0                # the same where the file system keeps whole seconds
MAX_KNOWN = 256               # files remembered; the oldest are forgotten first
KNOWN_FILE = "known-files"


def stamp(path: Path) -> list[int] | None:
    """The file's stamp, or None when it is not a regular file (or cannot be stat'ed)."""
    try:
        return _of(os.stat(path))
    except OSError:
        return None


def _of(st: os.stat_result) -> list[int] | None:
    if not stat.S_ISREG(st.st_mode):
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _still_from_ns(found: list[int]) -> int:
    """When a stamp can be believed: its last change plus a clock tick of its file system (COARSE_S where the times
    are whole seconds, else RACY_S)."""
    coarse = found[3] % 1_000_000_000 == 0 and found[4] % 1_000_000_000 == 0
    return max(found[3], found[4]) + int((COARSE_S if coarse else RACY_S) * 1e9)


def settled(found: list[int] | None, now_ns: int | None = None) -> bool:
    """The file had not changed for longer than a clock tick of its file system: its stamp cannot repeat after a
    write."""
    if found is None:
        return False
    return (time.time_ns() if now_ns is None else now_ns) > _still_from_ns(found)


def folder_stamp(folder: Path) -> dict[str, list[int]] | None:
    """relative path -> stamp of every file under `folder`; None when it holds a link or anything but files and
    folders, or is not a folder (one lstat per entry)."""
    folder = Path(folder)
    found: dict[str, list[int]] = {}
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None
        for path in sorted(folder.rglob("*")):
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                continue
            one = _of(st)           # None for a link, a FIFO, a socket...
            if one is None:
                return None
            found[path.relative_to(folder).as_posix()] = one
    except OSError:
        return None
    return found


def folder_settled(found: dict[str, list[int]] | None) -> bool:
    now = time.time_ns()
    return found is not None and all(settled(one, now) for one in found.values())


def settled_folder_stamp(folder: Path) -> dict[str, list[int]] | None:
    """folder_stamp, once every file in it has been still for a clock tick: a run folder written a moment ago is
    stamped after waiting out the rest of RACY_S (never longer: on a file system of whole seconds it is stamped as
    it is, and not believed until a later look finds it settled)."""
    found = folder_stamp(folder)
    if not found:
        return found
    wait = max(_still_from_ns(one) for one in found.values()) - time.time_ns()
    if 0 < wait <= RACY_S * 1e9:
        time.sleep(wait / 1e9 + 0.01)
        found = folder_stamp(folder)
    return found


MARK_FILE = ".clock"          # in home/quick/: written by clock_mark, to read the file system's time


def clock_mark(where: Path | None = None) -> tuple[int, int] | None:
    """(device, ns): the file system's time now, as the stamp of a write made there (home/quick/.clock); None
    when it cannot be written. Take it before the stamps it is to vouch for (changed_before)."""
    path = Path(where) if where is not None else home() / QUICK / MARK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(b"\n")
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_mtime_ns


def changed_before(found: dict[str, list[int]] | None, mark: tuple[int, int] | None) -> bool:
    """Every file of a folder stamp was last changed before the mark, on the mark's device: the stamp can be believed
    however recent the files are (a write after the mark would have moved a time past it)."""
    return bool(found) and mark is not None and all(
        one[0] == mark[0] and max(one[3], one[4]) < mark[1] for one in found.values())


def believed_folder_stamp(folder: Path, mark: tuple[int, int] | None) -> dict[str, list[int]] | None:
    """folder_stamp, at once where every file changed before `mark` (changed_before, taken before this call), else
    once every file has been still for a tick (settled_folder_stamp)."""
    found = folder_stamp(folder)
    return found if changed_before(found, mark) else settled_folder_stamp(folder)


class KnownHashes:
    """sha256 of files by their stamp, sealed under this machine's cache key (read once, saved by `save`)."""

    def __init__(self, where: Path | None = None):
        self.path = where or home() / QUICK / KNOWN_FILE
        doc, _ = read_sealed(self.path)
        files = (doc or {}).get("files")
        self.files: dict[str, list] = files if isinstance(files, dict) else {}
        self.changed = False

    def sha256(self, path: Path) -> str:
        """The file's sha256: from its stamp when it is known and unchanged, else read (and remembered when the
        file is settled and did not change while it was read). OSError as open() raises it."""
        name = os.path.abspath(path)
        before = stamp(path)
        known = self.files.get(name)
        if before is not None and isinstance(known, list) and known[:-1] == before:
            return known[-1]           # recorded settled: an equal stamp now is the same bytes
        with open(path, "rb") as stream:
            sha = hashlib.file_digest(stream, "sha256").hexdigest()
        if before is not None and settled(before) and stamp(path) == before:
            self.files.pop(name, None)
            self.files[name] = [*before, sha]
            self.changed = True
        return sha

    def save(self) -> None:
        """Write the record back when it learned a file (the newest MAX_KNOWN); nothing is lost but speed when two
        processes save at once (the last one's record stays)."""
        if not self.changed:
            return
        kept = dict(list(self.files.items())[-MAX_KNOWN:])
        try:
            write_sealed(self.path, {"files": kept})
        except OSError:
            return
        self.changed = False
