"""The home's on-disk state: the one owner of TIERGATE_HOME's layout and its operations (stdlib only).

Layout under `home()`:
  runs/<run key>/                 a result folder (result.json, outputs.npz), reused while it verifies
  runs/<run key>.shards/A-B/      finished shards of a run whose other shards are missing, until merged
  decisions/<key>.json            a decision with the hashes of every input it was made from (sealed)
  quick/<request key>.json        the fast path's entry for an unchanged `tiergate gate` (sealed)
  runtime-graphs/<key>/           the describe cache (a tier's runtime graph of an artifact)
  compiled/<key>/                 the compile cache: an artifact compiled for a class (tiergate.compiler: model.so,
                                  tvm-meta.json), sealed like the describe cache
  explain/<key>/                  explain's tensor dumps
  data/<sha>.npz                  content-hashed archives (loader data, early-decision chunks)
  mlflow/<key>/                   a model version's files fetched from MLflow (tiergate.mlflow_bridge), sealed;
  mlflow/watch-<key>.json         the MLflow watcher's last version seen of a registered model
  locks/<key>.lock                one fcntl lock per key: one run (or decision) of a key at a time

Everything written here is written whole or not at all: to `NAME.part-PID-TID` beside its final
place, then renamed (`part_path`, `parse_part`: the one naming, which gc reads to tell a live
writer from a dead one); a full disk is the one-line EnvironmentProblem of errors.disk_full.
The orchestrator, the fast path (quickgate) and gc all use this module; it imports no numpy.

Decision files, fast-path entries and saved runs (run.seal: every file's sha256 and the run's name) are sealed: an
HMAC-SHA256 under a key kept outside the home
(`cache_key_path`: $TIERGATE_CACHE_KEY, else ${XDG_CONFIG_HOME:-~/.config}/tiergate/cache.key, 32 random
bytes made 0600 on first use). A file whose seal is missing or wrong (edited, or restored from a home
sealed under another key) is never believed: a decision is made again from the verified runs, a run is run again.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tiergate.errors import disk_full, is_disk_full
from tiergate.hashing import file_sha256
from tiergate.images import graph_cache_key
from tiergate.paths import home

RUNS, DECISIONS, LOCKS, QUICK, GRAPHS, EXPLAIN, DATA, MLFLOW = (
    "runs", "decisions", "locks", "quick", "runtime-graphs", "explain", "data", "mlflow")
COMPILED = "compiled"
RESULT_FILE = "result.json"
OUTPUTS_FILE = "outputs.npz"
SHARDS_SUFFIX = ".shards"          # runs/<key>.shards/<start>-<stop>/
DECISION_SCHEMA = 1
PART_MARK = ".part-"
_PART = re.compile(r"^(?P<key>.+?)(?P<ext>\.json)?\.part-(?P<pid>\d+)-[0-9a-z]+$")


# --- names ----------------------------------------------------------------------------------------


def runs_root() -> Path:
    return home() / RUNS


def run_key(*parts: str) -> str:
    """The identity of a run's input: unchanged key, unchanged result."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def shard_folder(root: Path, key: str, span: tuple[int, int]) -> Path:
    return root / f"{key}{SHARDS_SUFFIX}" / f"{span[0]}-{span[1]}"


def shards_of(root: Path, key: str) -> Path:
    return root / f"{key}{SHARDS_SUFFIX}"


def decision_path(key: str) -> Path:
    return home() / DECISIONS / f"{key}.json"


def quick_entry_path(key: str) -> Path:
    return home() / QUICK / f"{key}.json"


def graph_folder(artifact_sha256: str, image_id: str, describer_sha256: str, cpu: str | None = None) -> Path:
    """The describe cache's folder of an artifact's runtime graph in a runtime image."""
    return home() / GRAPHS / graph_cache_key(artifact_sha256, image_id, describer_sha256, cpu)


def compiled_folder(key: str) -> Path:
    """The compile cache's folder of an artifact compiled for a class (key: tiergate.compiler.compile_key)."""
    return home() / COMPILED / key


COMPILE_SOURCE = "source.json"      # in a compiled folder: the artifact, class and compiler image it is of (gc)
COMPILE_META = "tvm-meta.json"      # in a compiled folder: what the compile recorded (passes, target, timings)


def compile_record(folder: Path, name: str = COMPILE_META) -> dict | None:
    """What a compile recorded in its folder (tvm-meta.json; Vela's: vela-meta.json), or None when it is not there
    (or unreadable)."""
    try:
        doc = json.loads((Path(folder) / name).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write_compile_source(folder: Path, artifact_sha256: str, device_class: str, compiler_image: str) -> None:
    (Path(folder) / COMPILE_SOURCE).write_text(json.dumps(
        {"artifact_sha256": artifact_sha256, "device_class": device_class, "compiler_image": compiler_image},
        sort_keys=True))


def explain_folder(key: str) -> Path:
    return home() / EXPLAIN / key


def data_root() -> Path:
    return home() / DATA


def mlflow_folder(key: str) -> Path:
    """Where a model version fetched from MLflow is cached (key: tracking/registry URI, name, version)."""
    return home() / MLFLOW / key


def mlflow_watch_path(key: str) -> Path:
    """The MLflow watcher's state of one registered model (the last version seen)."""
    return home() / MLFLOW / f"watch-{key}.json"


def part_tag() -> str:
    """This process's and thread's part tag (a writer that spans threads takes one and passes it on)."""
    return f"{os.getpid()}-{threading.get_ident()}"


def part_path(final: Path, tag: str | None = None) -> Path:
    """Where `final` is written before it is renamed into place: one name per writer (process and thread)."""
    return final.with_name(f"{final.name}{PART_MARK}{tag or part_tag()}")


def temp_name(stem: str, unique: str) -> str:
    """A temporary name of the same family for a store that is not this machine's (a uuid, not a pid)."""
    return f"{stem}{PART_MARK}0-{unique}"


def is_part(name: str) -> bool:
    return PART_MARK in name


def parse_part(name: str) -> tuple[str, int] | None:
    """(the final name's key, the writer's pid) of a part name; None for any other name."""
    match = _PART.match(name)
    return (match["key"], int(match["pid"])) if match else None


# --- writing whole or not at all --------------------------------------------------------------------


def replace_dir(work: Path, folder: Path) -> None:
    """Put a finished folder in place (a rename in the same directory); the old one goes first. A run folder that
    holds an ok result is sealed first, for its final name (seal_run)."""
    if (work / RESULT_FILE).is_file():
        seal_run(work, folder)
    if folder.exists():
        old = folder.with_name(f"{folder.name}.old-{os.getpid()}-{threading.get_ident()}")
        folder.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    work.rename(folder)


@contextmanager
def writing_folder(folder: Path) -> Iterator[Path]:
    """Yield a fresh part folder; on success it replaces `folder`, on failure it is removed (a full disk
    raises the one-line EnvironmentProblem)."""
    work = part_path(folder)
    shutil.rmtree(work, ignore_errors=True)
    try:
        yield work
        folder.parent.mkdir(parents=True, exist_ok=True)
        replace_dir(work, folder)
    except BaseException as exc:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(exc, OSError) and is_disk_full(exc):
            raise disk_full(exc, folder.parent) from None
        raise


def write_text(path: Path, text: str) -> Path:
    """Write a file atomically (part file + rename in the same folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = part_path(path)
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(exc, path.parent) from None
        raise
    return path


def write_json(path: Path, doc: dict, *, sort_keys: bool = False) -> Path:
    return write_text(path, json.dumps(doc, indent=1, sort_keys=sort_keys, allow_nan=False))


# --- locks ----------------------------------------------------------------------------------------


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


# --- saved runs -----------------------------------------------------------------------------------


def read_result(folder: Path) -> dict | None:
    """A run folder's result.json as JSON, or None when it is missing or unreadable."""
    try:
        doc = json.loads((folder / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def run_verifies(folder: Path) -> bool:
    """A saved ok result whose outputs are the ones it names, sealed by this machine's key for this run's name with
    exactly its files (seal_run): a run edited, copied from another run's folder or from a home made elsewhere is
    never believed."""
    doc = read_result(folder)
    if doc is None or doc.get("status") != "ok" or not doc.get("outputs_sha256"):
        return False
    try:
        if file_sha256(folder / OUTPUTS_FILE) != doc["outputs_sha256"]:
            return False
    except OSError:
        return False
    return run_sealed(folder)


RUN_SEAL = "run.seal"            # in a run folder: the sealed list of its files and the run's name


def _run_name(folder: Path) -> str:
    """A run folder's name as its seal binds it: the run key, or KEY.shards/START-STOP for a shard."""
    parent = Path(folder).parent.name
    return f"{parent}/{Path(folder).name}" if parent.endswith(SHARDS_SUFFIX) else Path(folder).name


def _run_files(folder: Path) -> dict[str, str] | None:
    """Every file of a run folder with its sha256 (the seal aside); None when it holds a link or anything but files
    and folders (a sealed run never does)."""
    files = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            return None
        name = path.relative_to(folder).as_posix()
        if path.is_file() and name != RUN_SEAL:
            files[name] = file_sha256(path)
    return files


def seal_run(work: Path, final: Path) -> None:
    """Seal a finished ok run (in `work`, for its place `final`): its files' sha256 and its run's name under this
    machine's key (nothing without a usable key: the run is then not reused). Called by replace_dir, and after a
    run's result.json changes in place."""
    doc = read_result(work)
    (Path(work) / RUN_SEAL).unlink(missing_ok=True)
    if doc is None or doc.get("status") != "ok":
        return
    files = _run_files(work)
    if files is not None:
        write_sealed(Path(work) / RUN_SEAL, {"run": _run_name(final), "files": files}, sort_keys=True)


def run_sealed(folder: Path) -> bool:
    """The run folder's seal verifies under this machine's key, names this run, and lists exactly its files."""
    doc, _ = read_sealed(Path(folder) / RUN_SEAL)
    if doc is None or doc.get("run") != _run_name(folder):
        return False
    try:
        return doc.get("files") == _run_files(folder)
    except OSError:
        return False


def verified(folder: Path, *, quiet: bool = False) -> bool:
    """run_verifies; anything else is discarded (with a warning, unless `quiet`)."""
    if not (folder / RESULT_FILE).exists():
        return False
    if run_verifies(folder):
        return True
    if not quiet:
        print(f"tiergate: warning: discarding the saved run {folder.name} (failed, or it does not verify: edited, "
              "or not sealed by this machine's cache key); running it again", file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    return False


def run_label_hash(folder: Path) -> tuple[str, str]:
    """(`FOLDER:sha256 of result.json`, its image id): how a decision names the run it was made from."""
    raw = (folder / RESULT_FILE).read_bytes()
    return f"{folder.name}:{hashlib.sha256(raw).hexdigest()}", json.loads(raw).get("image_id", "")


def run_matches(folder: Path, inputs: dict, label: str) -> bool:
    """The run folder still holds the result a decision (its `inputs`) was made from, and it verifies."""
    if folder.parent != runs_root():
        return False
    try:
        named, image = run_label_hash(folder)
    except (OSError, ValueError):
        return False
    return inputs["runs"].get(label) == named and image == inputs["images"].get(label) and run_verifies(folder)


# --- the seal of decisions and fast-path entries ---------------------------------------------------

CACHE_KEY_BYTES = 32
SEAL = "seal"
_KEY_WARNED: set[str] = set()


def cache_key_path() -> Path:
    """Where the cache's seal key lives: outside the home, so a home copied from elsewhere is not trusted."""
    explicit = os.environ.get("TIERGATE_CACHE_KEY")
    if explicit:
        return Path(explicit)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "tiergate" / "cache.key"


def cache_key() -> bytes | None:
    """The seal key (made on first use, atomically: two gates at once agree on one key); None when it can be
    neither read nor made (a warning once: the gate then decides and caches nothing)."""
    path = cache_key_path()
    try:
        if _inside_home(path):
            raise ValueError("it lies inside TIERGATE_HOME: a home restored from elsewhere would bring its own key")
        key = _read_key(path)
        if key is None:
            key = _make_key(path)
        if len(key) != CACHE_KEY_BYTES:
            raise ValueError(f"it holds {len(key)} bytes, not {CACHE_KEY_BYTES}")
        return key
    except (OSError, ValueError) as exc:
        if str(path) not in _KEY_WARNED:
            _KEY_WARNED.add(str(path))
            text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            print(f"tiergate: warning: the cache key {path} is unusable ({text}); decisions are not cached and "
                  "saved runs are not reused", file=sys.stderr)
        return None


def _inside_home(path: Path) -> bool:
    from tiergate.paths import home_path

    try:
        resolved, root = Path(path).resolve(), home_path().resolve()
    except OSError:
        return False
    return resolved == root or root in resolved.parents


def _read_key(path: Path) -> bytes | None:
    """The key's bytes, read without following a link, from a regular file this user owns that nobody else may
    read or write (mode 0600 or stricter); ValueError saying why otherwise (the key is then unusable: a key others
    can read lets them forge seals, one others can write lets them choose it)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if Path(path).is_symlink():
            raise ValueError("it is a symbolic link; the key must be a file of its own") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is not a regular file")
        if info.st_uid != os.geteuid():
            raise ValueError(f"it is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})")
        if info.st_mode & 0o077:
            raise ValueError(f"its mode is {stat.S_IMODE(info.st_mode):04o}: others may read or write it "
                             f"(chmod 600 {path})")
        return os.read(fd, CACHE_KEY_BYTES + 1)
    finally:
        os.close(fd)


def _make_key(path: Path) -> bytes:
    """32 random bytes, written 0600 to a new part file (never through a link) and linked into place: the first
    writer wins, every other one reads the winner's key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = part_path(path)
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)         # whatever the umask
            handle.write(os.urandom(CACHE_KEY_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    key = _read_key(path)
    if key is None:
        raise FileNotFoundError(f"{path} vanished as it was made")
    return key


def seal_of(doc: dict, key: bytes) -> str:
    """The HMAC-SHA256 of a document (its canonical JSON, without its own seal)."""
    body = json.dumps({k: v for k, v in doc.items() if k != SEAL}, sort_keys=True, allow_nan=False)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def write_sealed(path: Path, doc: dict, *, sort_keys: bool = False) -> Path | None:
    """Write a sealed JSON document atomically (its key order kept unless `sort_keys`: the seal is over the
    canonical form); None (nothing written) when there is no usable cache key."""
    key = cache_key()
    if key is None:
        return None
    return write_json(path, {**doc, SEAL: seal_of(doc, key)}, sort_keys=sort_keys)


def read_sealed(path: Path) -> tuple[dict | None, str]:
    """(the document, "") when its seal verifies under this machine's key; else (None, why): "absent",
    "unreadable", "unsealed" (no seal or a wrong one: edited, or sealed under another key) or "no key"."""
    try:
        if Path(path).is_symlink():            # a sealed file is the home's own: never read through a link
            return None, "unreadable"
        doc = json.loads(path.read_text(), parse_constant=_no_constant)
    except FileNotFoundError:
        return None, "absent"
    except (OSError, ValueError, RecursionError):
        return None, "unreadable"
    if not isinstance(doc, dict):
        return None, "unreadable"
    key = cache_key()
    if key is None:
        return None, "no key"
    seal = doc.get(SEAL)
    try:
        expected = seal_of(doc, key)
    except (ValueError, TypeError, RecursionError):
        return None, "unreadable"
    if not isinstance(seal, str) or not hmac.compare_digest(seal, expected):
        return None, "unsealed"
    return doc, ""


def _no_constant(name: str):
    """JSON's NaN and Infinity are never in a sealed file (it is written with allow_nan=False)."""
    raise ValueError(f"{name} in a sealed file")


# --- cached folders (runtime graphs, explain dumps): a sealed manifest of their files ---------------

MANIFEST = "manifest.json"


def publish_folder(work: Path, folder: Path) -> None:
    """Put a finished cache folder in place in one rename (a concurrent twin may win: fine), with a sealed
    manifest naming every file's sha256 (none without a cache key: the folder is then made again next time)."""
    files = {p.relative_to(work).as_posix(): file_sha256(p) for p in sorted(work.rglob("*"))
             if p.is_file() and p.name != MANIFEST}
    write_sealed(work / MANIFEST, {"files": files})
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(work, folder)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not folder.is_dir():
            raise


def folder_verifies(folder: Path) -> bool:
    """A cache folder whose sealed manifest verifies and names exactly its files, each with the same sha256."""
    doc, _ = read_sealed(folder / MANIFEST)
    files = doc.get("files") if doc is not None else None
    if not isinstance(files, dict):
        return False
    try:
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST}
        return present == set(files) and all(file_sha256(folder / name) == sha for name, sha in files.items())
    except OSError:
        return False


def cached_folder(folder: Path, what: str) -> bool:
    """Whether a cache folder is there and verifies (folder_verifies); one that does not (truncated, edited,
    unsealed) is discarded with a warning, and the caller makes it again."""
    if not folder.is_dir():
        return False
    if folder_verifies(folder):
        return True
    discard_folder(folder, what, "it does not verify (truncated, edited, or made under another cache key)")
    return False


def discard_folder(folder: Path, what: str, why: str) -> None:
    print(f"tiergate: warning: discarding the cached {what} {folder.name}: {why}; making it again", file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)


# --- decisions ------------------------------------------------------------------------------------


def classes_identity(device_classes) -> str:
    """A decision's `device_classes` input: the classes by content (the orchestrator and the fast path alike)."""
    import dataclasses

    text = "\n".join(json.dumps(dataclasses.asdict(dc), sort_keys=True, default=str) for dc in device_classes)
    return hashlib.sha256(text.encode()).hexdigest()


def policy_identity(policy) -> str:
    """A decision's `policy` input: the effective policy by content (defaults, per-tier overrides, metrics) and
    the files it came from (the decision names them in `policy_sources`: two files of one content are two
    decisions, each naming its own file)."""
    import dataclasses

    parts = [dataclasses.asdict(policy.defaults), policy.overrides, policy.metrics, list(policy.sources)]
    if getattr(policy, "outputs", None):
        parts.append(policy.outputs)          # (absent when empty: the keys of decisions made before it hold)
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def decision_key_of(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def read_decision(key: str, inputs: dict, *, discard: bool = False) -> dict | None:
    """The saved decision's JSON for exactly these inputs, when its seal verifies (read_sealed), or None. With
    `discard`, a file that does not verify is removed with a warning (the caller then decides again)."""
    doc, why = read_sealed(decision_path(key))
    if why in ("absent", "no key"):
        return None
    if doc is not None and doc.get("schema") == DECISION_SCHEMA and doc.get("key") == key \
            and doc.get("inputs") == inputs and isinstance(doc.get("decision"), dict):
        return doc["decision"]
    if discard:
        discard_decision(key, "its seal is missing or wrong (edited, or made under another cache key)"
                         if why == "unsealed" else "it does not match its inputs")
    return None


def discard_decision(key: str, why: str = "it does not match its inputs") -> None:
    path = decision_path(key)
    print(f"tiergate: warning: discarding the cached decision {path.name}: {why}; deciding again", file=sys.stderr)
    path.unlink(missing_ok=True)


def save_decision(key: str, inputs: dict, decision: dict) -> Path | None:
    """Write a decision (its JSON) with its inputs, sealed, atomically; None when it cannot be sealed (no usable
    cache key: the gate has decided, nothing is cached)."""
    doc = {"schema": DECISION_SCHEMA, "key": key, "created_at": now_iso(), "inputs": inputs, "decision": decision}
    return write_sealed(decision_path(key), doc, sort_keys=True)


def read_quick_entry(key: str) -> dict | None:
    """The fast path's entry for a request key when its seal verifies; None otherwise (the normal path runs)."""
    return read_sealed(quick_entry_path(key))[0]


def save_quick_entry(key: str, entry: dict) -> Path | None:
    return write_sealed(quick_entry_path(key), entry)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --- reading the home (tiergate gc) ---------------------------------------------------------------


@dataclass
class Saved:
    """One saved thing under the home, as gc reads it: a decision file or a run folder."""

    path: Path
    key: str
    created: datetime | None
    size: int
    inputs: dict | None = None      # a decision's inputs (None: unreadable)
    artifact: str | None = None     # a run's artifact sha
    image_id: str = ""              # a run's image id


def entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def saved_decisions(root: Path) -> list[Saved]:
    return [_read_decision(p) for p in entries(root / DECISIONS) if p.is_file()]


def saved_runs(root: Path) -> list[Saved]:
    return [_read_run(p) for p in entries(root / RUNS) if p.is_dir()]


def saved_compiles(root: Path) -> list[Saved]:
    """The compile cache's folders (and part folders of compiles being written), each with its artifact's sha256
    when its source.json says it."""
    out = []
    for path in entries(root / COMPILED):
        if not path.is_dir():
            continue
        try:
            doc = json.loads((path / COMPILE_SOURCE).read_text())
        except (OSError, ValueError):
            doc = {}
        artifact = doc.get("artifact_sha256") if isinstance(doc, dict) else None
        out.append(Saved(path, path.name, datetime.fromtimestamp(path.stat().st_mtime, timezone.utc),
                         folder_size(path), artifact=artifact or None))
    return out


def saved_mlflow(root: Path) -> list[Saved]:
    """The MLflow download cache's folders (and part folders of downloads in progress), each with its artifact's
    sha256 when its identity file says it; never the watcher's state files (mlflow/watch-*.json)."""
    out = []
    for path in entries(root / MLFLOW):
        if not path.is_dir() or path.is_symlink():
            continue
        try:
            doc = json.loads((path / "identity.json").read_text())
        except (OSError, ValueError):
            doc = {}
        artifact = doc.get("artifact_sha256") if isinstance(doc, dict) else None
        out.append(Saved(path, path.name, datetime.fromtimestamp(path.stat().st_mtime, timezone.utc),
                         folder_size(path), artifact=artifact if isinstance(artifact, str) and artifact else None))
    return out


def _read_decision(path: Path) -> Saved:
    stat = path.stat()
    created = datetime.fromtimestamp(stat.st_mtime, timezone.utc)
    key, inputs = path.name.split(".", 1)[0], None
    if path.suffix == ".json":
        try:
            doc = json.loads(path.read_text())
            if isinstance(doc, dict) and isinstance(doc.get("inputs"), dict):
                inputs, key = doc["inputs"], str(doc.get("key") or key)
                created = parse_iso(doc.get("created_at")) or created
        except (OSError, ValueError):
            pass
    return Saved(path, key, created, stat.st_size, inputs=inputs)


def _read_run(path: Path) -> Saved:
    doc = read_result(path) or {}
    times = [p.stat().st_mtime for p in (path, path / RESULT_FILE) if p.exists()]
    return Saved(path, path.name, datetime.fromtimestamp(max(times), timezone.utc), folder_size(path),
                 artifact=doc.get("artifact_sha256") or None, image_id=doc.get("image_id") or "")


def folder_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def parse_iso(value) -> datetime | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        # Docker's CreatedAt may carry nanoseconds: 2024-01-02T03:04:05.123456789Z
        match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", str(value))
        if not match:
            return None
        when = datetime.fromisoformat(match[1]).replace(tzinfo=timezone.utc)
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def remove_compiled(path: Path, root: Path) -> str | None:
    """Remove a compiled library's folder under its compile's lock (tiergate.compiler.compiled); returns why it
    was kept, or None when removed."""
    return _remove_locked(path, root, f"compile-{path.name}", "a gate is compiling or reading this compile meanwhile")


def remove_run(path: Path, root: Path) -> str | None:
    """Remove a run folder under its key's lock (a gate that starts this run meanwhile waits, then re-runs
    it); returns why it was kept, or None when removed."""
    return _remove_locked(path, root, path.name, "a gate started this run meanwhile")


def _remove_locked(path: Path, root: Path, lock: str, busy: str) -> str | None:
    """Remove a folder under the key lock `lock` (a part folder at once); `busy` + "; kept" when it is held."""
    if parse_part(path.name) is not None:
        shutil.rmtree(path)
        return None
    with try_key_lock(lock, root) as got:
        if not got:
            return f"{busy}; kept"
        shutil.rmtree(path)
    return None
