"""The evaluation data: one `.npz` archive, one array per model input, optionally `labels`.

Each input array has a *sample axis*: found from the model's symbolic dimensions
(`state` [2, batch, 128] -> axis 1; the first non-fixed dimension), or given
explicitly (`--sample-axis state=1`). A 0-d array is a constant fed to every call
(silero VAD's `sr`). `labels` always have the sample axis first: one class index
per sample (classification), a mask per sample (segmentation), numbers (regression),
a text per sample (a 1-D string array); or `labels` is a 0-d string naming a side file
of texts or COCO-style boxes (tiergate.labels), whose labels an archive then carries.

A data *loader* (`FILE.py:FUNCTION`, tiergate.dataloader) is materialised into a
content-hashed archive under TIERGATE_HOME/data (written byte-for-byte
deterministically here: the same samples give the same file and hash, so run caching
and "the same data on every tier" hold), and containers only ever see arrays.

An archive whose sample axes are not all leading, or that holds constants, carries
them in a member named `__tiergate_axes__` (a JSON string; the harness reads it),
so a normalised archive needs no other side channel. Shapes and dtypes are read
from the `.npy` headers; arrays are read on first use, once (validation reads the float ones to refuse
NaN and infinities).
"""

from __future__ import annotations

import hashlib
import json
import stat
import threading
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiergate import labels as labels_mod
from tiergate import state
from tiergate.artifact.model import TensorSpec
from tiergate.request import is_loader  # noqa: F401 - re-exported
from tiergate.errors import InputError
from tiergate.hashing import file_sha256
from tiergate.results import read_npy_header

LABELS = labels_mod.LABELS
AXES_MEMBER = "__tiergate_axes__"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class ArrayInfo:
    shape: tuple[int, ...]
    dtype: str


class ReadAhead:
    """An evaluation archive read on a thread of its own while the models are taken in (the gate starts it before
    its intake): the file's hash and its float input arrays (what check_finite reads). `load_eval_data` takes them
    only where its file is the one read, unchanged since (device, inode, size, modification and change times),
    else it reads the file itself. Nothing raises here: a file that cannot be read is load_eval_data's to refuse."""

    def __init__(self, source: str | Path):
        self.path, self.key, self.sha256 = Path(source), None, ""
        self.arrays: dict[str, np.ndarray] = {}
        self._done = threading.Event()
        threading.Thread(target=self._read, name="tiergate-data-ahead", daemon=True).start()

    def _read(self) -> None:
        try:
            if not stat.S_ISREG(self.path.stat().st_mode):     # a FIFO or a device: never opened here
                return
            key, sha256 = _file_key(self.path), file_sha256(self.path)
            floats = [name for name, info in _read_headers(self.path).items()      # what check_finite reads;
                      if name not in (LABELS, AXES_MEMBER, labels_mod.RAGGED_MEMBER)  # the rest stays lazy
                      and np.dtype(info.dtype).kind in "fc"]
            with np.load(self.path, allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in floats}
            if _file_key(self.path) == key:
                self.key, self.sha256, self.arrays = key, sha256, arrays
        except Exception:  # noqa: BLE001 - read again, and refused with its reason, by load_eval_data
            pass
        finally:
            self._done.set()

    def of(self, path: Path) -> ReadAhead | None:
        """Itself, once read, where `path` is its file unchanged; else None."""
        if path != self.path:
            return None
        self._done.wait()
        try:
            return self if self.key is not None and _file_key(path) == self.key else None
        except OSError:
            return None


def _file_key(path: Path) -> tuple[int, ...]:
    info = path.stat()
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


class _LazyArrays(Mapping):
    """Arrays by name, read from the archive on first access (or read ahead: ReadAhead) and kept."""

    def __init__(self, path: Path, names: list[str], ahead: ReadAhead | None = None):
        self._path, self._names = path, names
        self._cache = {name: array for name, array in (ahead.arrays if ahead else {}).items() if name in names}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._cache:
            with np.load(self._path, allow_pickle=False) as npz:
                self._cache[name] = npz[name]
        return self._cache[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@dataclass
class EvalData:
    path: Path
    sha256: str
    n_samples: int
    info: dict[str, ArrayInfo]               # input arrays only, by name (no labels)
    labels: np.ndarray | labels_mod.BoxLabels | None = None   # numbers or texts; boxes (tiergate.labels)
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    axes: dict[str, int | None] = field(default_factory=dict)     # input -> sample axis; None: a constant
    output_axes: dict[str, int] = field(default_factory=dict)     # explicit sample axes of outputs
    source: str = ""                                              # the loader spec, when a loader made it
    labels_file: str = ""                                         # the side file the labels were read from
    # what a rewritten archive (normalised) was made from: {"data": the .npz's sha256, "labels_file": its side
    # file's sha256 or None}; the fast path keys a request by those files (quickgate.identity)
    origin: dict = field(default_factory=dict)

    def axis(self, name: str) -> int | None:
        return self.axes.get(name, 0 if self.info[name].shape else None)

    def iter_batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Consecutive batches (the last may be short), views along each input's sample axis; constants whole."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        for start in range(0, self.n_samples, batch_size):
            yield {name: take(self.arrays[name], self.axis(name), start, start + batch_size) for name in self.info}

    def stacked_labels(self) -> np.ndarray | None:
        return self.labels

    def call_shapes(self) -> dict[str, list[int | None]]:
        """One call's shape per input: the sample axis None (the batch a device class fills in), a constant's
        whole shape (what a compiler makes a model static at: tiergate.build.compiling)."""
        shapes = {}
        for name, info in self.info.items():
            shape: list[int | None] = list(info.shape)
            axis = self.axis(name)
            if axis is not None:
                shape[axis] = None
            shapes[name] = shape
        return shapes


def take(array: np.ndarray, axis: int | None, start: int, stop: int) -> np.ndarray:
    """Samples [start, stop) along `axis` (a view); a constant (axis None) whole."""
    if axis is None:
        return array
    return array[(slice(None),) * axis + (slice(start, stop),)]


# --- sample axes -------------------------------------------------------------------------------


def parse_sample_axes(items) -> dict[str, int]:
    """`NAME=AXIS` items (repeatable `--sample-axis`) -> {name: axis}."""
    axes = {}
    for item in items or ():
        name, sep, value = str(item).rpartition("=")
        if not sep or not name or not value.lstrip("-").isdigit():
            raise InputError(f"--sample-axis {item!r}: expected NAME=AXIS, e.g. state=1")
        axes[name] = int(value)
    return axes


def dynamic_dim(dim) -> bool:
    """A dimension a model leaves open (symbolic, unknown or not positive): a batch the caller chooses."""
    return not (isinstance(dim, int) and dim > 0)


def model_sample_axis(spec: TensorSpec, shape: tuple[int, ...] | None = None) -> int | None:
    """The sample axis of a model input: its first symbolic dimension; None for a 0-d input (a constant).

    A fully fixed shape: the first axis where the data differs from it, else axis 0.
    """
    if not spec.shape:
        return None
    dynamic = [axis for axis, dim in enumerate(spec.shape) if dynamic_dim(dim)]
    if dynamic:
        return dynamic[0]
    if shape is not None and len(shape) == len(spec.shape):
        differ = [axis for axis, (have, want) in enumerate(zip(shape, spec.shape)) if have != want]
        if differ:
            return differ[0]
    return 0


# --- loading an archive ----------------------------------------------------------------------


def load_eval_data(path: str | Path, inputs: list[TensorSpec] | None = None,
                   sample_axes: dict[str, int] | None = None, ahead: ReadAhead | None = None) -> EvalData:
    """Open an evaluation `.npz`; every problem is an InputError naming the file. `ahead`: the file read
    beforehand (ReadAhead), taken where it is this file, unchanged.

    Sample axes: explicit (`sample_axes`), else the archive's own (`__tiergate_axes__`), else the
    model's (`inputs`), else the leading axis; a 0-d array is a constant.
    """
    path = Path(path)
    ahead = ahead.of(path) if ahead is not None else None
    infos = _read_headers(path)
    label_info, boxes_info = infos.pop(LABELS, None), infos.pop(labels_mod.RAGGED_MEMBER, None)
    meta = _read_meta(path, infos.pop(AXES_MEMBER, None))
    if not infos:
        raise InputError(f"evaluation data {path}: holds no input arrays (only labels or nothing)")
    explicit = dict(sample_axes or {})
    specs = {spec.name: spec for spec in inputs or ()}
    axes: dict[str, int | None] = {}
    for name, info in infos.items():
        if name in explicit:
            axis = explicit[name]
        elif name in meta.get("inputs", {}):
            axis = meta["inputs"][name]
        elif not info.shape:
            axis = None
        elif name in specs and len(specs[name].shape) == len(info.shape):
            axis = model_sample_axis(specs[name], info.shape)
        else:
            axis = 0
        if axis is not None and not 0 <= axis < max(len(info.shape), 1):
            raise InputError(f"evaluation data {path}: sample axis {axis} of '{name}' is outside its shape "
                             f"{info.shape}")
        if axis is not None and not info.shape:
            raise InputError(f"evaluation data {path}: '{name}' is 0-d (a constant); it has no sample axis {axis}")
        axes[name] = axis
    outputs = {k: v for k, v in explicit.items() if k not in infos}
    outputs = {**meta.get("outputs", {}), **outputs}
    n_samples = _sample_count(path, infos, axes)
    labels, side_file = _read_labels(path, label_info, boxes_info)
    data = EvalData(path=path, sha256=ahead.sha256 if ahead else file_sha256(path), n_samples=n_samples, info=infos,
                    labels=labels, arrays=_LazyArrays(path, list(infos), ahead), axes=axes, output_axes=outputs,
                    source=meta.get("source", ""), labels_file=side_file)
    _check_labels(data)
    return data


def _read_labels(path: Path, label_info: ArrayInfo | None, boxes_info: ArrayInfo | None):
    """(labels, the side file they came from or ""): numbers or texts in `labels`, boxes in the JSON member, or
    a 0-d string `labels` naming a side file (tiergate.labels)."""
    if label_info is not None and boxes_info is not None:
        raise InputError(f"evaluation data {path}: holds both 'labels' and '{labels_mod.RAGGED_MEMBER}'; one only")
    if label_info is None and boxes_info is None:
        return None, ""
    with np.load(path, allow_pickle=False) as npz:
        if boxes_info is not None:
            return labels_mod.BoxLabels.from_json(str(npz[labels_mod.RAGGED_MEMBER][()]), f"evaluation data {path}"), ""
        labels = npz[LABELS]
    if labels.dtype.kind == "U" and labels.ndim == 0:
        name = str(labels[()])
        side = labels_mod.read_side_file(name, path)
        return side, str((path.parent / name).resolve())
    return labels, ""


def needs_axes_member(data: EvalData) -> bool:
    """Whether the harness must be told the sample axes (anything but leading axes everywhere)."""
    return any(axis != 0 for axis in data.axes.values()) or bool(data.output_axes)


def normalised(data: EvalData) -> EvalData:
    """The same data in an archive that carries its sample axes (content-hashed), when they are not all
    leading; otherwise `data` itself (an unchanged file keeps its hash and its cached runs). Either way its
    `origin` names the files it came from."""
    origin = {"data": data.sha256, "labels_file": file_sha256(data.labels_file) if data.labels_file else None}
    if data.labels_file:      # the labels come into the archive, so its hash covers them
        arrays = {name: data.arrays[name] for name in data.info} | labels_mod.members(data.labels)
        meta = {"inputs": data.axes, "outputs": data.output_axes} if needs_axes_member(data) else None
        return _with_origin(load_eval_data(write_archive(arrays, meta)), origin)
    if not needs_axes_member(data) or data.source or _has_meta(data.path):
        return _with_origin(data, origin)
    arrays = {name: data.arrays[name] for name in data.info}
    if data.labels is not None:
        arrays |= labels_mod.members(data.labels)
    path = write_archive(arrays, {"inputs": data.axes, "outputs": data.output_axes})
    return _with_origin(load_eval_data(path), origin)


def _with_origin(data: EvalData, origin: dict) -> EvalData:
    data.origin = origin
    return data


def validate_against(data: EvalData, inputs: list[TensorSpec], sample_axes: dict[str, int] | None = None) -> None:
    """The data must feed exactly the model's inputs: names, dtypes, shapes but the sample axis."""
    where = f"evaluation data {data.source or data.path}"
    wanted = {spec.name: spec for spec in inputs}
    for name in wanted:
        if name not in data.info:
            raise InputError(f"{where}: model input '{name}' is missing (arrays: {', '.join(data.info)})")
    for name in data.info:
        if name not in wanted:
            raise InputError(f"{where}: array '{name}' is not a model input (inputs: {', '.join(wanted)})")
    for name, spec in wanted.items():
        _check_input(where, data.info[name], spec, data.axis(name))
    _check_labels(data)
    check_finite(data)


def check_finite(data: EvalData) -> None:
    """Every float input (and float labels) must be finite: a NaN or an infinity fed to both models is no
    evidence about either (it would be judged as their outputs' disagreement). Names the first bad sample."""
    where = f"evaluation data {data.source or data.path}"
    arrays = [(name, data.axis(name), data.info[name].dtype) for name in data.info]
    if data.labels is not None and not labels_mod.is_ragged(data.labels):
        arrays.append((LABELS, 0, data.labels.dtype.name))
    for name, axis, dtype in arrays:
        if np.dtype(dtype).kind not in "fc":
            continue
        array = data.labels if name == LABELS else data.arrays[name]
        bad = ~np.isfinite(array)
        if not bad.any():
            continue
        what = "labels" if name == LABELS else f"input '{name}'"
        rule = "labels must be finite numbers" if name == LABELS else "inputs must be finite numbers"
        if axis is None:
            value = np.asarray(array)[bad].flat[0]
            raise InputError(f"{where}: {what} (a constant) holds {value}; {rule}")
        per_sample = np.moveaxis(bad, axis, 0).reshape(bad.shape[axis], -1).any(axis=1)
        first = int(np.argmax(per_sample))
        sample = np.moveaxis(array, axis, 0)[first]
        value = np.asarray(sample)[~np.isfinite(sample)].flat[0]
        raise InputError(f"{where}: {what} holds {value} at sample {first} (and {int(per_sample.sum()) - 1} other "
                         f"sample(s)); {rule}")


def _check_input(where: str, info: ArrayInfo, spec: TensorSpec, axis: int | None) -> None:
    if info.dtype != spec.dtype:
        raise InputError(f"{where}: input '{spec.name}' has dtype {info.dtype}, the model wants {spec.dtype}")
    expected = shape_text(spec.shape, axis)
    if len(info.shape) != len(spec.shape):
        where_axis = "a constant: 0-d" if axis is None else f"sample axis {axis}"
        raise InputError(f"{where}: input '{spec.name}' has shape {info.shape}, the model wants "
                         f"{expected} ({where_axis})")
    for i, (have, want) in enumerate(zip(info.shape, spec.shape)):
        if i != axis and isinstance(want, int) and want > 0 and have != want:
            raise InputError(f"{where}: input '{spec.name}' has shape {info.shape}, the model wants "
                             f"{expected} (axis {i} is {have}, must be {want})")


def _check_labels(data: EvalData) -> None:
    labels = data.labels
    if labels is None:
        return
    where = f"evaluation data {data.source or data.path}: labels" + (
        f" (from {data.labels_file})" if data.labels_file else "")
    if labels.ndim == 0:
        raise InputError(f"{where} must hold one label per sample (first axis = sample), got a 0-d array")
    if not (labels_mod.is_ragged(labels) or np.issubdtype(labels.dtype, np.integer)
            or np.issubdtype(labels.dtype, np.floating) or labels.dtype == np.bool_):
        raise InputError(f"{where} must be numbers, texts (a 1-D string array) or a side file's name (a 0-d "
                         f"string), got dtype {labels.dtype}")
    if len(labels) != data.n_samples:
        raise InputError(f"{where}: {len(labels)} labels but the inputs hold {data.n_samples} samples")


def shape_text(shape, axis: int | None = 0) -> str:
    return "(" + ", ".join("N" if i == axis else ("?" if dynamic_dim(d) else str(d))
                           for i, d in enumerate(shape)) + ")"


def _read_headers(path: Path) -> dict[str, ArrayInfo]:
    try:
        with zipfile.ZipFile(path) as archive:
            return dict(_member_info(path, archive, member) for member in archive.namelist())
    except FileNotFoundError:
        raise InputError(f"evaluation data {path}: file does not exist") from None
    except IsADirectoryError:
        raise InputError(f"evaluation data {path}: is a folder, not an .npz file") from None
    except zipfile.BadZipFile:
        raise InputError(f"evaluation data {path}: not an .npz archive (numpy.savez)") from None


def _read_meta(path: Path, info: ArrayInfo | None) -> dict:
    if info is None:
        return {}
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(str(npz[AXES_MEMBER][()]))
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
        return meta
    except ValueError as exc:
        raise InputError(f"evaluation data {path}: '{AXES_MEMBER}' is not tiergate's sample-axes JSON ({exc})") \
            from None


def _has_meta(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return f"{AXES_MEMBER}.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _member_info(path: Path, archive: zipfile.ZipFile, member: str) -> tuple[str, ArrayInfo]:
    name = member[:-4] if member.endswith(".npy") else member
    try:
        with archive.open(member) as stream:
            shape, dtype = read_npy_header(stream)
    except ValueError as exc:
        raise InputError(f"evaluation data {path}: '{name}' is not a numpy array ({exc})") from None
    if dtype.hasobject:
        raise InputError(f"evaluation data {path}: '{name}' holds Python objects; only numeric arrays are allowed")
    return name, ArrayInfo(shape=tuple(shape), dtype=dtype.name)


def _sample_count(path: Path, infos: dict[str, ArrayInfo], axes: dict[str, int | None]) -> int:
    counts = {name: info.shape[axes[name]] for name, info in infos.items() if axes[name] is not None}
    if not counts:
        raise InputError(f"evaluation data {path}: holds only constants (0-d arrays); at least one input "
                         "needs a sample axis")
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"'{n}' {c}" + (f" (axis {axes[n]})" if axes[n] else "") for n, c in counts.items())
        raise InputError(f"evaluation data {path}: arrays disagree on the number of samples ({listed}); "
                         "a non-leading sample axis can be named with --sample-axis NAME=AXIS")
    n = next(iter(counts.values()))
    if n == 0:
        raise InputError(f"evaluation data {path}: holds no samples")
    return n




def check_sample_count(data: EvalData, needed: int, why: str) -> None:
    """Refuse data with fewer samples than the statistics need (a gate must not PROMOTE on no evidence)."""
    if data.n_samples < needed:
        raise InputError(f"evaluation data {data.path}: {data.n_samples} sample(s), but the gate needs at least "
                         f"{needed} ({why})")


def label_classes(outputs: list[TensorSpec]) -> tuple[str, int] | None:
    """(output name, class count) of the output labels are scored against, when the artifact's shapes say it.

    The gate scores labels against the first output with two or more scores per sample;
    None when an output before it (or it) has a dynamic shape: known only after a run.
    """
    for spec in outputs:
        dims = spec.shape[1:]
        if not all(isinstance(d, int) and d > 0 for d in dims):
            return None
        classes = 1
        for d in dims:
            classes *= d
        if classes >= 2:
            return spec.name, classes
    return None


def is_class_indices(labels) -> bool:
    """One class index per sample: integers, none negative (a negative label is no class index: only a metric of
    the user's reads such labels)."""
    return (isinstance(labels, np.ndarray) and labels.ndim == 1 and np.issubdtype(labels.dtype, np.integer)
            and (labels.size == 0 or int(labels.min()) >= 0))


def check_labels_within(data: EvalData, output: str, classes: int) -> None:
    """Every label must name one of the output's classes."""
    labels = data.labels
    if not is_class_indices(labels):
        return       # not class indices (masks, scores, texts, boxes): no class count to check against
    if labels.size and int(labels.max()) >= classes:
        raise InputError(f"evaluation data {data.path}: label {int(labels.max())} is outside output '{output}', "
                         f"which has {classes} classes (labels 0..{classes - 1})")


# --- writing: deterministic archives ---------------------------------------------------------------


def data_dir() -> Path:
    return state.data_root()


def write_archive(arrays: dict[str, np.ndarray], meta: dict | None = None, folder: Path | None = None) -> Path:
    """An .npz (np.load reads it) whose bytes depend on the arrays only, named by its sha256."""
    folder = folder or data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = state.part_path(folder / "archive.npz")
    members = dict(arrays)
    if meta:
        members[AXES_MEMBER] = np.array(json.dumps(meta, sort_keys=True))
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as stream:
                array = np.asarray(members[name])          # (np.ascontiguousarray would make 0-d arrays 1-d)
                np.lib.format.write_array(stream, array if array.flags.c_contiguous else array.copy(order="C"),
                                          allow_pickle=False)
    path = folder / f"{file_sha256(tmp)[:32]}.npz"
    tmp.replace(path)
    return path


def subset(data: EvalData, start: int, stop: int) -> EvalData:
    """Samples [start, stop) as their own content-hashed archive (sample axes and constants kept); the whole
    range is `data` itself (its file, its hash, its cached runs)."""
    if (start, stop) == (0, data.n_samples):
        return data
    if not 0 <= start < stop <= data.n_samples:
        raise ValueError(f"samples {start}-{stop} are outside 0-{data.n_samples}")
    arrays = {name: take(data.arrays[name], data.axis(name), start, stop) for name in data.info}
    if data.labels is not None:
        arrays |= labels_mod.members(data.labels[start:stop])
    meta = {"inputs": data.axes, "outputs": data.output_axes} if needs_axes_member(data) else None
    return load_eval_data(write_archive(arrays, meta))


def select(data: EvalData, rows) -> EvalData:
    """The samples at file positions `rows` (in that order) as their own content-hashed archive (sample axes and
    constants kept); every sample in file order is `data` itself (its file, its hash, its cached runs)."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) == data.n_samples and np.array_equal(rows, np.arange(data.n_samples)):
        return data
    if len(rows) == 0 or rows.min() < 0 or rows.max() >= data.n_samples:
        raise ValueError(f"sample rows outside 0-{data.n_samples}")
    arrays = {name: data.arrays[name] if data.axis(name) is None else np.take(data.arrays[name], rows,
                                                                              axis=data.axis(name))
              for name in data.info}
    if data.labels is not None:
        arrays |= labels_mod.members(data.labels[rows])
    meta = {"inputs": data.axes, "outputs": data.output_axes} if needs_axes_member(data) else None
    return load_eval_data(write_archive(arrays, meta))


def sample_keys(data: EvalData, seed: int) -> np.ndarray:
    """One 128-bit key per sample, (n, 2) uint64: a keyed hash of the seed and the sample's own bytes (every
    input's slice along its sample axis, with its shape and dtype, and its label; constants left out), so an
    order made from the keys is the file order's no more than the samples' (an early decision's partition,
    orchestrator.spans.sample_order). Copies of one sample (a blank frame, a repeated line) are told apart by
    their occurrence: the j-th copy's key hashes the sample's key with j, so the copies scatter over the
    chunks like any samples instead of all landing in one (which copy is the j-th cannot matter: they are the
    same sample)."""
    salt = int(seed).to_bytes(8, "little")
    columns = []
    for name in sorted(data.info):
        axis = data.axis(name)
        if axis is not None:
            columns.append((name, np.moveaxis(np.asarray(data.arrays[name]), axis, 0)))
    keys = np.empty((data.n_samples, 2), dtype=np.uint64)
    copies: dict[bytes, int] = {}
    for i in range(data.n_samples):
        digest = hashlib.blake2b(salt, digest_size=16)
        for name, column in columns:
            one = np.ascontiguousarray(column[i])
            digest.update(f"{name}\0{one.dtype.str}\0{one.shape}\0".encode())
            digest.update(one.tobytes())
        if data.labels is not None:
            digest.update(b"labels\0" + labels_mod.sample_bytes(data.labels, i))
        key = digest.digest()
        copy = copies.get(key, 0)
        copies[key] = copy + 1
        if copy:            # the j-th copy of a sample seen before
            key = hashlib.blake2b(salt + key + copy.to_bytes(8, "little"), digest_size=16).digest()
        keys[i] = np.frombuffer(key, dtype="<u8")
    return keys
