"""Saved target results: what one run of one artifact on one device class produced.

Running and comparing are separate steps (as in Polygraphy): the execution layer
writes a result folder, the compare/gate layer reads it, possibly elsewhere.

A result folder holds:
  result.json   the fields of TargetResult (schema below), status "ok" or "failed"
  outputs.npz   one array per model output, named as the output, first axis = sample

What the host reads of a run's outputs is capped (`OUTPUT_LIMIT_BYTES`, $TIERGATE_MAX_OUTPUT_BYTES, default
1 GiB): the arrays' sizes are read from their .npy headers before anything is loaded (`outputs_nbytes`); a run
over it is a failed run (`over_output_limit`), never a host out of memory. Shards are joined by streaming
(`concat_outputs`): one shard's array in memory at a time.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiergate.codec import decode, encode
from tiergate.figures import MB, DeviceFigures, NodeTime, OpProfile, OpTime  # noqa: F401 - re-exported
from tiergate.errors import InputError
from tiergate.state import OUTPUTS_FILE, RESULT_FILE, SHARDS_SUFFIX  # noqa: F401 - re-exported

SCHEMA = 1
OUTPUT_LIMIT_ENV = "TIERGATE_MAX_OUTPUT_BYTES"
# The most one run's outputs may hold: the container's file size limit (RLIMIT_FSIZE) and what the host reads.
OUTPUT_LIMIT_BYTES = int(os.environ.get(OUTPUT_LIMIT_ENV) or 1024 ** 3)


@dataclass
class TargetResult:
    device_class: str
    status: str                      # "ok" or "failed"
    artifact_sha256: str = ""
    tier: str = ""
    reason: str | None = None        # why it failed, one line
    log_tail: str = ""               # last lines of the container log, for failures
    runtime: str = ""                # onnxruntime | tflite | onnxruntime-gpu
    versions: dict[str, str] = field(default_factory=dict)  # runtime, numpy, python
    machine: str = ""                # uname -m inside the run: x86_64, aarch64
    cpu: dict = field(default_factory=dict)   # the CPU the runtime saw: {"model", "features", "source"} (harness_cpu)
    emulated: bool = False
    threads: int = 1
    batch_size: int = 1
    n_samples: int = 0
    latencies_ns: list[int] = field(default_factory=list)  # one per inference call
    warmup: int = 0
    image: str = ""                  # image tag
    image_id: str = ""               # image digest / id
    data_sha256: str = ""
    outputs_sha256: str = ""         # sha256 of outputs.npz, set by the host after a run: a cached run must match it
    started_at: str = ""
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)
    device: DeviceFigures | None = None  # load, first call, memory, size, op profile (None: not measured)
    oom_limit_bytes: int | None = None   # the run was killed at this memory limit (an OOM finding)
    schema: int = SCHEMA

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict:
        return encode(self)

    @classmethod
    def from_json(cls, data: dict) -> "TargetResult":
        known = {f for f in cls.__dataclass_fields__}
        return decode(cls, {k: v for k, v in data.items() if k in known})


def failed(device_class: str, reason: str, **fields) -> TargetResult:
    return TargetResult(device_class=device_class, status="failed", reason=reason, **fields)


def save(result: TargetResult, folder: Path, outputs: dict[str, np.ndarray] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if outputs is not None:
        np.savez(folder / OUTPUTS_FILE, **outputs)
    tmp = folder / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=1))
    tmp.replace(folder / RESULT_FILE)
    return folder


def load(folder: Path) -> TargetResult:
    path = folder / RESULT_FILE
    try:
        return TargetResult.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise InputError(f"no saved result in {folder} ({RESULT_FILE} missing)") from None
    except (json.JSONDecodeError, TypeError) as exc:
        raise InputError(f"saved result {path} is unreadable: {exc}") from None


def load_outputs(folder: Path) -> dict[str, np.ndarray]:
    path = folder / OUTPUTS_FILE
    if not path.exists():
        raise InputError(f"no saved outputs in {folder} ({OUTPUTS_FILE} missing)")
    problem = over_output_limit(folder)          # checked before anything is loaded
    if problem:
        raise InputError(f"{folder}: {problem}")
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def read_npy_header(stream) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of the .npy array at the start of `stream`, nothing loaded; ValueError when it is not a
    .npy of format 1.0 or 2.0 (the one reader of .npy headers: evaluation data and saved outputs)."""
    version = np.lib.format.read_magic(stream)
    reader = _NPY_HEADERS.get(version)
    if reader is None:
        raise ValueError(f"unsupported .npy format version {version}")
    shape, _, dtype = reader(stream)
    return tuple(shape), dtype


def output_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array of an .npz: (shape, dtype) from its .npy header, nothing loaded."""
    found = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with archive.open(info) as fh:
                    found[info.filename[:-len(".npy")]] = read_npy_header(fh)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: not a readable .npz ({exc})") from None
    return found


def outputs_nbytes(folder: Path) -> int:
    """What loading the run's outputs would take in memory (from the headers)."""
    return sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
               for shape, dtype in output_headers(folder / OUTPUTS_FILE).values())


def over_output_limit(folder: Path, nbytes: int | None = None) -> str | None:
    """Why the run's outputs are too large to read (one line), or None."""
    nbytes = outputs_nbytes(folder) if nbytes is None else nbytes
    if nbytes <= OUTPUT_LIMIT_BYTES:
        return None
    return (f"its outputs hold {nbytes} bytes, over the output limit of {OUTPUT_LIMIT_BYTES} bytes per run "
            f"(${OUTPUT_LIMIT_ENV}; fewer samples, or fewer or smaller outputs)")


def concat_outputs(folders: list[Path], dest: Path) -> None:
    """dest/outputs.npz: the outputs of `folders` (shards, in sample order) joined along the first axis, streamed
    (one shard's array in memory at a time, never the whole run twice)."""
    headers = [output_headers(folder / OUTPUTS_FILE) for folder in folders]
    first = headers[0]
    for folder, other in zip(folders[1:], headers[1:]):
        if list(other) != list(first) or any(other[n][1] != first[n][1] or other[n][0][1:] != first[n][0][1:]
                                             for n in first):
            raise InputError(f"{folder}: its outputs differ from the first shard's in names, dtypes or shapes")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest / OUTPUTS_FILE, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, (shape, dtype) in first.items():
            total = (sum(h[name][0][0] for h in headers), *shape[1:])
            with archive.open(f"{name}.npy", "w", force_zip64=True) as out:
                np.lib.format.write_array_header_2_0(out, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                           "fortran_order": False, "shape": total})
                for folder in folders:
                    with np.load(folder / OUTPUTS_FILE, allow_pickle=False) as npz:
                        out.write(np.ascontiguousarray(npz[name]).data)
