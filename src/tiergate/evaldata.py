"""The evaluation data: one `.npz`, one array per model input, optionally `labels`.

The first axis of every array is the sample axis. Shapes and dtypes are read
from the `.npy` headers inside the archive, so validation touches no array
data; arrays are read on first use, once, and batches are views, not copies.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiergate.hashing import file_sha256
from tiergate.artifact.model import TensorSpec
from tiergate.errors import InputError

LABELS = "labels"
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


@dataclass(frozen=True)
class ArrayInfo:
    shape: tuple[int, ...]
    dtype: str


class _LazyArrays(Mapping):
    """Arrays by name, read from the archive on first access and kept."""

    def __init__(self, path: Path, names: list[str]):
        self._path, self._names, self._cache = path, names, {}

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
    labels: np.ndarray | None = None
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)

    def iter_batches(self, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
        """Consecutive batches (the last may be short), as views into the arrays."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        for start in range(0, self.n_samples, batch_size):
            yield {name: self.arrays[name][start:start + batch_size] for name in self.info}


def load_eval_data(path: str | Path) -> EvalData:
    """Open an evaluation `.npz`; every problem is an InputError naming the file."""
    path = Path(path)
    infos = _read_headers(path)
    label_info = infos.pop(LABELS, None)
    if not infos:
        raise InputError(f"evaluation data {path}: holds no input arrays (only labels or nothing)")
    n_samples = _sample_count(path, infos)
    labels = None
    if label_info is not None:
        with np.load(path, allow_pickle=False) as npz:
            labels = npz[LABELS]
    data = EvalData(path=path, sha256=file_sha256(path), n_samples=n_samples, info=infos,
                    labels=labels, arrays=_LazyArrays(path, list(infos)))
    _check_labels(data)
    return data


def validate_against(data: EvalData, inputs: list[TensorSpec]) -> None:
    """The data must feed exactly the model's inputs: names, dtypes, shapes but the sample axis."""
    where = f"evaluation data {data.path}"
    wanted = {spec.name: spec for spec in inputs}
    for name in wanted:
        if name not in data.info:
            raise InputError(f"{where}: model input '{name}' is missing (arrays: {', '.join(data.info)})")
    for name in data.info:
        if name not in wanted:
            raise InputError(f"{where}: array '{name}' is not a model input (inputs: {', '.join(wanted)})")
    for name, spec in wanted.items():
        _check_input(where, data.info[name], spec)
    _check_labels(data)


def _check_input(where: str, info: ArrayInfo, spec: TensorSpec) -> None:
    if info.dtype != spec.dtype:
        raise InputError(f"{where}: input '{spec.name}' has dtype {info.dtype}, the model wants {spec.dtype}")
    expected = _shape_text(spec.shape)
    if len(info.shape) != len(spec.shape):
        raise InputError(f"{where}: input '{spec.name}' has shape {info.shape}, the model wants "
                         f"{expected} (first axis = sample)")
    for axis, (have, want) in enumerate(zip(info.shape[1:], spec.shape[1:]), start=1):
        if isinstance(want, int) and want > 0 and have != want:
            raise InputError(f"{where}: input '{spec.name}' has shape {info.shape}, the model wants "
                             f"{expected} (axis {axis} is {have}, must be {want})")


def _check_labels(data: EvalData) -> None:
    labels = data.labels
    if labels is None:
        return
    where = f"evaluation data {data.path}: labels"
    if labels.ndim != 1:
        raise InputError(f"{where} must be one integer per sample (shape ({data.n_samples},)), got shape "
                         f"{labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise InputError(f"{where} must be integers, got dtype {labels.dtype}")
    if len(labels) != data.n_samples:
        raise InputError(f"{where}: {len(labels)} labels but the inputs hold {data.n_samples} samples")
    if len(labels) and labels.min() < 0:
        raise InputError(f"{where} must not be negative (found {labels.min()})")


def _shape_text(shape) -> str:
    return "(" + ", ".join("N" if i == 0 else ("?" if not isinstance(d, int) or d <= 0 else str(d))
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


def _member_info(path: Path, archive: zipfile.ZipFile, member: str) -> tuple[str, ArrayInfo]:
    name = member[:-4] if member.endswith(".npy") else member
    try:
        with archive.open(member) as stream:
            version = np.lib.format.read_magic(stream)
            read_header = _HEADER_READERS.get(version)
            if read_header is None:
                raise ValueError(f"unsupported .npy format version {version}")
            shape, _, dtype = read_header(stream)
    except ValueError as exc:
        raise InputError(f"evaluation data {path}: '{name}' is not a numpy array ({exc})") from None
    if dtype.hasobject:
        raise InputError(f"evaluation data {path}: '{name}' holds Python objects; only numeric arrays are allowed")
    return name, ArrayInfo(shape=tuple(shape), dtype=dtype.name)


def _sample_count(path: Path, infos: dict[str, ArrayInfo]) -> int:
    counts = {}
    for name, info in infos.items():
        if not info.shape:
            raise InputError(f"evaluation data {path}: '{name}' is a scalar; the first axis must be the sample axis")
        counts[name] = info.shape[0]
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"'{n}' {c}" for n, c in counts.items())
        raise InputError(f"evaluation data {path}: arrays disagree on the number of samples ({listed})")
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


def check_labels_within(data: EvalData, output: str, classes: int) -> None:
    """Every label must name one of the output's classes."""
    labels = data.labels
    if labels is not None and labels.size and int(labels.max()) >= classes:
        raise InputError(f"evaluation data {data.path}: label {int(labels.max())} is outside output '{output}', "
                         f"which has {classes} classes (labels 0..{classes - 1})")
