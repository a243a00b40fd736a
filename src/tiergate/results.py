"""Saved target results: what one run of one artifact on one device class produced.

Running and comparing are separate steps (as in Polygraphy): the execution layer
writes a result folder, the compare/gate layer reads it, possibly elsewhere.

A result folder holds:
  result.json   the fields of TargetResult (schema below), status "ok" or "failed"
  outputs.npz   one array per model output, named as the output, first axis = sample
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiergate.codec import decode, encode
from tiergate.figures import MB, DeviceFigures, NodeTime, OpProfile, OpTime  # noqa: F401 - re-exported
from tiergate.errors import InputError
from tiergate.state import OUTPUTS_FILE, RESULT_FILE, SHARDS_SUFFIX  # noqa: F401 - re-exported

SCHEMA = 1


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
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}
