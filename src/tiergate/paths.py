"""Where tiergate finds its catalogue, container recipes and working folders; the checks on where it writes.

`home()` is checked once per process and path, the first time it is asked for: a home that is a file, under a
system folder (/proc, /sys, /dev) or not writable is one line and exit 2 (EnvironmentProblem), never a
traceback. `check_outputs` is the one check every command runs on the paths a user names for it to write:
none may be an input (the same path, a link to it, a hard link of it) or lie inside the home. `read_regular` is the
one read of a file a user names by path (a model, a key, an attestation): regular files only (a FIFO would block
for ever, /dev/zero never ends), at most a given size; `write_new` the one write of a file a user names for output
(whole or not at all, never through a link planted there).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from tiergate.errors import EnvironmentProblem, InputError

_PACKAGE_DIR = Path(__file__).resolve().parent


def project_root() -> Path:
    """The checkout holding targets/ and containers/ (TIERGATE_ROOT overrides)."""
    env = os.environ.get("TIERGATE_ROOT")
    if env:
        return Path(env).resolve()
    for parent in _PACKAGE_DIR.parents:
        if (parent / "targets").is_dir() and (parent / "containers").is_dir():
            return parent
    return Path.cwd()


def targets_dir() -> Path:
    return Path(os.environ.get("TIERGATE_TARGETS_DIR") or project_root() / "targets")


def containers_dir() -> Path:
    return project_root() / "containers"


def qemu_binary(name: str) -> Path:
    """A QEMU user-mode binary scripts/setup fetched (qemu-aarch64, qemu-x86_64): TIERGATE_SYSTEM_DIR/qemu/NAME."""
    return Path(os.environ.get("TIERGATE_SYSTEM_DIR") or "/opt/tiergate") / "qemu" / name


HOME_ENV = "TIERGATE_HOME"
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")
_CHECKED_HOMES: set[str] = set()


def home_path() -> Path:
    """Where the home is (TIERGATE_HOME, else ./.tiergate), unchecked."""
    return Path(os.environ.get(HOME_ENV) or Path.cwd() / ".tiergate")


def home() -> Path:
    """tiergate's working state: registry, artifact store, run results, caches (checked usable: `check_home`)."""
    path = home_path()
    key = str(path.absolute())
    if key not in _CHECKED_HOMES:
        check_home(path)
        _CHECKED_HOMES.add(key)
    return path


def check_home(path: Path) -> None:
    """A usable home: a folder (made when missing) this process can write, outside the system's folders."""
    where = f"TIERGATE_HOME {path}" if os.environ.get(HOME_ENV) else f"the home {path} (TIERGATE_HOME is not set)"
    hint = "set TIERGATE_HOME to a writable folder"
    resolved = path.resolve()
    system = next((s for s in SYSTEM_FOLDERS if resolved == Path(s) or Path(s) in resolved.parents), None)
    if system is not None:
        raise EnvironmentProblem(f"{where}: is under {system}, a system folder, not a place for tiergate's state",
                                 hint=hint)
    if resolved.exists() and not resolved.is_dir():
        raise EnvironmentProblem(f"{where}: is a file, not a folder", hint=hint)
    problem = _write_problem(resolved)
    if problem:
        raise EnvironmentProblem(f"{where}: cannot write there ({problem})", hint=hint)


def _write_problem(folder: Path) -> str | None:
    """Why files cannot be written in `folder` (made when missing), or None."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".tiergate-probe-"):
            pass
    except (FileExistsError, NotADirectoryError):
        return "a file is in the way of that folder"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def writable_folder(folder: Path, option: str) -> None:
    """Make sure files can be written in `folder` (made when missing) before any work starts, or say why not."""
    problem = _write_problem(Path(folder))
    if problem:
        raise EnvironmentProblem(f"{option} {folder}: cannot write there ({problem})")


# --- reading what a user names ---------------------------------------------------------------------------


def read_regular(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file (a link to one is fine), at most `limit` bytes; InputError (exit 2) naming it for
    anything else: missing, a folder, a FIFO, socket or device, larger than `limit`, unreadable. Opened without
    blocking (a FIFO is never waited on) and judged on the descriptor itself (no race with a swapped path)."""
    import stat

    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path}: is a folder, not a file") from None
    except OSError as exc:
        check_regular(path, what)            # a socket refuses to open (ENXIO): say what it is
        raise InputError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise InputError(f"{what} {path}: is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode) else \
                "a device"
            raise InputError(f"{what} {path}: is {kind}, not a regular file")
        if info.st_size > limit:
            raise InputError(f"{what} {path}: is {info.st_size:,} bytes, more than the {limit:,} a {what} may be")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise InputError(f"{what} {path}: grew past {limit:,} bytes while read")
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def check_regular(path: Path | None, what: str) -> None:
    """InputError when `path` is there but is neither a regular file nor a folder (a FIFO would block the first
    read for ever, a device never ends): checked on every input file before any work starts. A missing path is
    left to the reader (it says so in its own words)."""
    import stat

    if path is None:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise InputError(f"{what} {path}: is {kind}, not a regular file")


def write_new(path: Path, data: bytes | str, mode: int = 0o644) -> Path:
    """Write a file whole or not at all: a temporary file of an unpredictable name made beside it with O_EXCL (never
    through a link someone planted), then renamed over `path` (a link there is replaced, never written through).
    Nothing is left behind on a failure (a full disk: the one-line EnvironmentProblem). The one writer of a file a
    user names for output: the attestation, the report folder's files, JUnit XML, explain's --out files."""
    from tiergate.errors import disk_full, is_disk_full

    data = data.encode("utf-8") if isinstance(data, str) else data
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException as exc:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise disk_full(exc, path) from None
        raise
    return path


# --- outputs never overwrite inputs -------------------------------------------------------------------


def _identity(path: Path) -> tuple[Path, tuple[int, int] | None]:
    """(resolved path, (st_dev, st_ino) of what it names, None when nothing is there)."""
    try:
        st = os.stat(path)
        inode = (st.st_dev, st.st_ino)
    except OSError:
        inode = None
    return Path(path).resolve(), inode


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_outputs(outputs: Iterable[tuple[str, Path]], inputs: Iterable[tuple[str, Path | None]],
                  *, artifacts: Iterable[tuple[str, Path | None]] = (),
                  parts: Callable[[Path], list[Path]] | None = None, folders: Iterable[tuple[str, Path]] = (),
                  outside_home: bool = True) -> None:
    """Refuse, before any work starts, an output that would overwrite an input or the home's state.

    `outputs`: (option, file) for every file the command will write; `folders`: (option, folder) for the
    folders they go into (each must not be a file, nor lie in the home). `inputs`: (what, path) of every
    file read (data, policy, loader or metric files, ...); `artifacts` too, and `parts(path)` names the
    other files an artifact is made of (ONNX external data), asked only where an output could be one of
    them (in the artifact's folder, or an existing file with more than one link). An output is refused
    when it is an input by path, through a symbolic link or as a hard link (same st_dev and st_ino),
    when it lies inside the home (TIERGATE_HOME), when it is an existing folder, or when two outputs are one
    file. Then each output's folder is made and checked writable. InputError / EnvironmentProblem: exit 2.
    `outside_home=False` is for tiergate's own work folders under the home (the demo's): inputs still count.
    """
    outputs, folders = [(o, Path(p)) for o, p in outputs], [(o, Path(p)) for o, p in folders]
    known = [(what, Path(p)) for what, p in inputs if p is not None]
    arts = [(what, Path(p)) for what, p in artifacts if p is not None]
    home_dir = home_path().resolve() if outside_home else None
    for option, folder in folders:
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{option} {folder}: is a file; give a folder")
        if home_dir is not None and _inside(folder.resolve(), home_dir):
            raise InputError(f"{option} {folder}: is inside tiergate's home ({home_dir}), whose files tiergate "
                             "owns; write it elsewhere")
    seen: dict[tuple, str] = {}
    for option, path in outputs:
        resolved, inode = _identity(path)
        if path.is_dir():
            raise InputError(f"{option} {path}: is a folder; give a file name")
        if home_dir is not None and _inside(resolved, home_dir):
            raise InputError(f"{option} {path}: is inside tiergate's home ({home_dir}), whose files tiergate "
                             "owns; write it elsewhere")
        candidates = list(known) + list(arts)
        if parts is not None and inode is not None:      # a path where nothing is yet overwrites nothing
            hard = os.stat(path).st_nlink > 1
            candidates += [(f"{what}'s file", part) for what, p in arts
                           if hard or _may_name(Path(p), resolved) for part in _parts(parts, p)]
        for what, source in candidates:
            src_resolved, src_inode = _identity(source)
            if resolved == src_resolved or (inode is not None and inode == src_inode):
                raise InputError(f"{option} {path}: is the {what} ({source}); writing there would overwrite an "
                                 "input: give another path")
        for key in (resolved, inode):
            if key is not None and key in seen and seen[key] != option:
                raise InputError(f"{option} {path}: is also where {seen[key]} writes; give another path")
            if key is not None:
                seen[key] = option
    for option, folder in folders:
        writable_folder(folder, option)
    for option, path in outputs:
        writable_folder(path.parent, option)


def _may_name(artifact: Path, output: Path) -> bool:
    """Whether `output` may be one of the artifact's own files: beside it, and its name in the artifact's bytes
    (an ONNX model names its external data files; a cheap look before the model is parsed)."""
    try:
        return output.parent == artifact.resolve().parent and output.name.encode() in artifact.read_bytes()
    except OSError:
        return False


def _parts(parts: Callable[[Path], list[Path]], path: Path) -> list[Path]:
    try:
        return list(parts(path))
    except (InputError, OSError):          # unreadable or no ONNX: the command says so itself
        return []
