"""The content-addressed store: artifacts and result folders by sha256, on disk or at an fsspec URL.

Layout under the store root (a folder, or any fsspec URL such as s3://bucket/tiergate):
  ab/<sha256>/model.onnx            an artifact (ONNX external data files beside it, at their
                                    relative locations), sha256 = the artifact's content hash
  results/ab/<sha256>/result.json   a saved run result folder (tiergate.results), sha256 over
  results/ab/<sha256>/outputs.npz   its files
  data/ab/<sha256>.npz              an evaluation archive a work pool's workers run (put_data)
  notes/<name>                      small texts replaced whole: a pooled share's heartbeat (write_note)

Keys kept in the registry are relative to the root, so a store can move. Each file is
written under a temporary name and renamed, and the file that marks an entry complete
(the model, result.json) is written last: a crash leaves no half entry that looks whole.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from tiergate.hashing import file_sha256
from tiergate.state import is_part, temp_name
from tiergate.errors import EnvironmentProblem, InputError, TiergateError
from tiergate.paths import home
from tiergate.registry.masking import masked, masked_text

STORE_ENV = "TIERGATE_STORE"
# where the exceptions of a store's filesystem come from (S3's and other object stores' clients, their HTTP): a
# fault of one of these is the machine's or the network's (exit 2), never a verdict nor an internal error
_FS_FAMILIES = frozenset({"fsspec", "s3fs", "botocore", "aiobotocore", "boto3", "gcsfs", "adlfs", "azure",
                          "aiohttp", "requests", "urllib3"})
RESULT_FILES = ("outputs.npz", "result.json")  # result.json last: it marks the entry complete


def default_location() -> str:
    return os.environ.get(STORE_ENV) or str(home() / "store")


class Store:
    """Content-addressed files in a folder or at an fsspec URL."""

    def __init__(self, location: str | Path | None = None):
        import fsspec

        self.location = str(location or default_location())
        with self._faults("cannot open it"):
            self.fs, root = fsspec.core.url_to_fs(self.location)
        self.root = root.rstrip("/")
        self._local = "file" in _protocols(self.fs)
        if self._local:
            self._check_local_root()

    def _check_local_root(self) -> None:
        """A folder store must be a folder we can write (made when missing): else say so now, not after."""
        root = Path(self.root)
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / temp_name(".probe", uuid.uuid4().hex)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise EnvironmentProblem(f"store {masked(self.location)}: cannot write there ({exc.strerror or exc})",
                                     hint="give --store a writable folder or an fsspec URL") from None

    def __repr__(self) -> str:
        return f"Store({masked(self.location)!r})"

    @contextmanager
    def _faults(self, what: str):
        """A fault of the store's filesystem (unreachable endpoint, no credentials, refused) as one line naming
        the store, secrets masked (registry.masking); anything else (a bug) stays as it is."""
        try:
            yield
        except TiergateError:
            raise
        except Exception as exc:
            if not is_store_fault(exc):
                raise
            text = masked_text(" ".join(str(exc).split()))[:400]
            raise EnvironmentProblem(f"store {masked(self.location)}: {what}: {type(exc).__name__}"
                                     + (f": {text}" if text else ""),
                                     hint="check that the store is reachable and its credentials") from None

    # -- paths ---------------------------------------------------------------
    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def url(self, key: str) -> str:
        """Where a key lies, as a path (local store) or a URL."""
        return self._path(key) if self._local else self.fs.unstrip_protocol(self._path(key))

    def exists(self, key: str) -> bool:
        with self._faults(f"cannot read {key}"):
            return self.fs.exists(self._path(key))

    # -- writing -------------------------------------------------------------
    def _put(self, local: Path, key: str) -> None:
        target = self._path(key)
        parent = target.rsplit("/", 1)[0]
        temp = f"{parent}/{temp_name('', uuid.uuid4().hex)}"
        try:
            self.fs.makedirs(parent, exist_ok=True)
            self.fs.put_file(str(local), temp)
            self.fs.mv(temp, target)
        except OSError as exc:
            try:
                if self.fs.exists(temp):
                    self.fs.rm(temp)
            except OSError:
                pass
            what = "disk full" if getattr(exc, "errno", None) in (28, 122) else "cannot write"
            text = masked_text(getattr(exc, "strerror", None) or exc)
            raise EnvironmentProblem(f"store {masked(self.location)}: {what} ({key}: {text})") from None

    def _put_entry(self, files: list[tuple[Path, str]]) -> None:
        """Files of one entry, the last one marking it complete; skipped when already whole."""
        if self.exists(files[-1][1]):
            return
        for local, key in files:
            with self._faults(f"cannot write {key}"):
                self._put(local, key)

    def put_artifact(self, path: Path, sha256: str, fmt: str, external_data: tuple[str, ...] = ()) -> str:
        """Store a model file under its content hash; returns its key.

        `external_data` are the ONNX external data locations (Artifact.external_data, checked by
        the loader); they are stored beside the model at the same relative places.
        """
        folder = f"{sha256[:2]}/{sha256}"
        files = [(path.parent / rel, f"{folder}/{_relative(rel)}") for rel in external_data]
        key = artifact_key(sha256, fmt)
        self._put_entry(files + [(path, key)])
        return key

    def put_result(self, folder: Path) -> str:
        """Store a result folder (result.json, outputs.npz if present); returns its key (a folder)."""
        present = [name for name in RESULT_FILES if (folder / name).is_file()]
        if "result.json" not in present:
            raise InputError(f"{folder}: no result.json to store")
        digest = hashlib.sha256()
        for name in present:
            digest.update(name.encode() + b"\0" + file_sha256(folder / name).encode())
        sha = digest.hexdigest()
        key = f"results/{sha[:2]}/{sha}"
        self._put_entry([(folder / name, f"{key}/{name}") for name in present])
        return key

    def put_data(self, path: Path, sha256: str) -> str:
        """Store an evaluation archive under its content hash (once); its key. A work pool's workers read the very
        samples the gate runs (a chunk of an early decision, a normalised archive) from here."""
        key = f"data/{sha256[:2]}/{sha256}.npz"
        self._put_entry([(Path(path), key)])
        return key

    def fetch_file(self, key: str, dest: Path) -> Path:
        """One stored file (an evaluation archive: put_data) copied to `dest`, whole or not at all."""
        if not self.exists(key):
            raise InputError(f"store {masked(self.location)}: {key} is missing")
        dest.parent.mkdir(parents=True, exist_ok=True)
        temp = dest.with_name(temp_name(dest.name, uuid.uuid4().hex))
        with self._faults(f"cannot read {key}"):
            try:
                self.fs.get_file(self._path(key), str(temp))
                os.replace(temp, dest)
            finally:
                temp.unlink(missing_ok=True)
        return dest

    def write_note(self, key: str, text: str) -> None:
        """A small text (a worker's heartbeat), replaced whole."""
        with tempfile.TemporaryDirectory(prefix="tiergate-note-") as tmp:
            local = Path(tmp) / "note"
            local.write_text(text)
            with self._faults(f"cannot write {key}"):
                self._put(local, key)

    def read_note(self, key: str) -> str | None:
        """A small text written by write_note, or None when there is none (yet, or any more)."""
        with self._faults(f"cannot read {key}"):
            try:
                return self.fs.cat_file(self._path(key)).decode()
            except FileNotFoundError:
                return None

    def remove(self, key: str) -> None:
        """Delete a stored entry (the folder of an artifact key, or a result key)."""
        folder = key if key.startswith(("results/", "notes/")) else key.rsplit("/", 1)[0]
        with self._faults(f"cannot remove {key}"):
            if self.fs.exists(self._path(folder)):
                self.fs.rm(self._path(folder), recursive=True)

    # -- reading -------------------------------------------------------------
    def fetch(self, key: str, dest: Path) -> Path:
        """Copy an artifact (its whole folder) or a result folder to dest; returns the model file or dest."""
        folder = key if key.startswith("results/") else key.rsplit("/", 1)[0]
        if not self.exists(key if key.startswith("results/") else key):
            raise InputError(f"store {masked(self.location)}: {key} is missing")
        dest.mkdir(parents=True, exist_ok=True)
        with self._faults(f"cannot read {key}"):
            for remote in self.fs.find(self._path(folder)):
                rel = remote[len(self._path(folder)) + 1:]
                if is_part(rel.split("/")[-1]):
                    continue
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(remote, str(dest / rel))
        return dest if key.startswith("results/") else dest / key.rsplit("/", 1)[1]


def is_store_fault(exc: BaseException) -> bool:
    """Whether an exception is the store's filesystem failing (an OSError, or raised by an object store's client)."""
    if isinstance(exc, (OSError, ImportError)):
        return True
    return any(cls.__module__.split(".")[0] in _FS_FAMILIES for cls in type(exc).__mro__)


def artifact_key(sha256: str, fmt: str) -> str:
    return f"{sha256[:2]}/{sha256}/model.{fmt}"


def _relative(location: str) -> str:
    parts = PurePosixPath(location.replace("\\", "/")).parts
    if not parts or parts[0] == "/" or ".." in parts:
        raise InputError(f"external data location {location!r} leaves the model's folder")
    return "/".join(parts)


def _protocols(fs) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
