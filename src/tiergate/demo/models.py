"""build_demo_set: the FP32 references, the candidates and the evaluation data, cached.

Every file comes from one trained CNN (see train.py) and fixed seeds; a set is
rebuilt only when the seed, this package's source or the toolchain versions change.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

import numpy as np

from tiergate.hashing import file_sha256
from tiergate.demo import data
from tiergate.demo.quiet import captured_output
from tiergate.errors import InputError

MANIFEST = "demo-set.json"
REFERENCE_ONNX = "digits-fp32.onnx"
REFERENCE_TFLITE = "digits-fp32.tflite"
EVAL_NPZ = "digits-eval.npz"
N_CALIBRATION = 256       # representative calibration images (training split)
N_BAD_CALIBRATION = 8     # the broken candidate's handful of images
_TOOLCHAIN = ("numpy", "scikit-learn", "onnx", "onnxruntime", "tensorflow-cpu", "tensorflow", "keras")

Expected = Literal["promote", "reject", "inconclusive"]


@dataclass(frozen=True)
class Candidate:
    name: str
    path: Path
    format: str          # "onnx" or "tflite"
    precision: str       # "int8", "fp16"
    expected: Expected   # what the demo gate should decide
    why: str


@dataclass(frozen=True)
class DemoSet:
    out_dir: Path
    seed: int
    reference_onnx: Path
    reference_tflite: Path
    candidates: list[Candidate]
    eval_data: Path
    train_accuracy: float     # FP32 ONNX reference, onnxruntime on this host
    test_accuracy: float
    reused: bool = field(default=False, compare=False)   # True when taken from the cache

    def candidate(self, name: str) -> Candidate:
        for cand in self.candidates:
            if cand.name == name:
                return cand
        raise KeyError(name)


# name, format, precision, expected, why; the recipes are in _build_candidates
CANDIDATES = (
    ("onnx-int8-entropy", "onnx", "int8", "inconclusive",
     f"INT8 QDQ (per-channel, reduce_range), Entropy calibration on {N_CALIBRATION} "
     "representative training images; it differs from FP32 on one test image, too few samples to decide "
     "(the demo confirms it on more)"),
    ("onnx-int8-badcal", "onnx", "int8", "reject",
     f"INT8 QDQ, MinMax calibration on {N_BAD_CALIBRATION} images fed as 8-bit pixels (0..255) "
     "instead of the model's [0, 1] range: every activation range is ~255x too wide"),
    ("tflite-fp16", "tflite", "fp16", "promote",
     "TFLiteConverter float16 weights (Optimize.DEFAULT, supported_types=[float16])"),
    ("tflite-int8", "tflite", "int8", "promote",
     f"TFLiteConverter full-integer kernels (TFLITE_BUILTINS_INT8), representative dataset of "
     f"{N_CALIBRATION} training images; float32 input and output"),
)


def build_demo_set(out_dir: Path, *, seed: int = 0, quiet: bool = True) -> DemoSet:
    """Write the demo models and eval data into `out_dir`, or reuse a matching earlier build.

    quiet: hold back TensorFlow's and the calibrators' console output (fd 1 and 2) while
    building, replaying it only if the build fails; pass False when another thread (a
    progress display) must keep writing to the terminal meanwhile.
    """
    out_dir = Path(out_dir)
    key = _cache_key(seed)
    cached = _load_cached(out_dir, key)
    if cached is not None:
        return cached
    _ensure_dir(out_dir)
    staging = out_dir / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with captured_output() if quiet else contextlib.nullcontext():
            demo = _build(staging, seed)
        demo = _move_into(demo, staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _write_manifest(out_dir, key, demo)
    return demo


def make_eval_npz(path: Path, n_samples: int, seed: int = 0) -> Path:
    """An eval .npz of `n_samples` (the test split, then jittered copies of it), e.g. 100,000."""
    images, labels = data.jittered_test_set(int(n_samples), seed)
    return data.write_eval_npz(Path(path), images, labels)


# ---------------------------------------------------------------- building

def _build(work: Path, seed: int) -> DemoSet:
    from tiergate.demo import onnx_export, tflite_export, train

    split = data.digits_split()
    weights = train.train_cnn(split, seed)
    ref_onnx = onnx_export.write_fp32(weights, work / REFERENCE_ONNX, seed=seed)
    ref_tflite = tflite_export.write_tflite(weights, work / REFERENCE_TFLITE, "fp32")
    candidates = _build_candidates(work, weights, ref_onnx, seed)
    eval_npz = data.write_eval_npz(work / EVAL_NPZ, split.x_test, split.y_test)
    train_acc, test_acc = (_onnx_accuracy(ref_onnx, x, y) for x, y in
                           ((split.x_train, split.y_train), (split.x_test, split.y_test)))
    return DemoSet(work, seed, ref_onnx, ref_tflite, candidates, eval_npz, train_acc, test_acc)


def _build_candidates(work: Path, weights, ref_onnx: Path, seed: int) -> list[Candidate]:
    from tiergate.demo import onnx_export, tflite_export

    calibration = data.calibration_images(N_CALIBRATION, seed)
    eight_bit = data.calibration_images(N_BAD_CALIBRATION, seed + 1) * 255.0   # the classic 0..255 mix-up
    recipes = {
        "onnx-int8-entropy": lambda p: onnx_export.quantize_int8(ref_onnx, p, calibration, "Entropy"),
        "onnx-int8-badcal": lambda p: onnx_export.quantize_int8(ref_onnx, p, eight_bit, "MinMax"),
        "tflite-fp16": lambda p: tflite_export.write_tflite(weights, p, "fp16"),
        "tflite-int8": lambda p: tflite_export.write_tflite(weights, p, "int8", calibration),
    }
    out = []
    for name, fmt, precision, expected, why in CANDIDATES:
        path = recipes[name](work / f"digits-{name}.{fmt}")
        out.append(Candidate(name, Path(path), fmt, precision, expected, why))
    return out


def _onnx_accuracy(model: Path, images: np.ndarray, labels: np.ndarray) -> float:
    from tiergate.ort_session import session as make_session

    session = make_session(str(model))
    (probs,) = session.run([data.OUTPUT_NAME], {data.INPUT_NAME: images})
    return float(np.mean(np.argmax(probs, axis=1) == labels))


def _move_into(demo: DemoSet, staging: Path, out_dir: Path) -> DemoSet:
    def move(path: Path) -> Path:
        target = out_dir / path.relative_to(staging)
        os.replace(path, target)
        return target

    candidates = [Candidate(c.name, move(c.path), c.format, c.precision, c.expected, c.why)
                  for c in demo.candidates]
    return DemoSet(out_dir, demo.seed, move(demo.reference_onnx), move(demo.reference_tflite),
                   candidates, move(demo.eval_data), demo.train_accuracy, demo.test_accuracy)


def _ensure_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: not a directory (the demo set needs a folder)")
    out_dir.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------- cache

def _code_version() -> str:
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def _toolchain() -> dict[str, str]:
    versions = {}
    for dist in _TOOLCHAIN:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _cache_key(seed: int) -> dict:
    return {"seed": seed, "code": _code_version(), "toolchain": _toolchain()}


def _key_matches(stored: dict, key: dict) -> bool:
    """Same seed and code; every package installed now has the version the set was built with.

    A package missing now (TensorFlow is an extra) does not invalidate a set built with it.
    """
    if stored.get("seed") != key["seed"] or stored.get("code") != key["code"]:
        return False
    built_with = stored.get("toolchain", {})
    return all(built_with.get(dist) == version for dist, version in key["toolchain"].items())


def _write_manifest(out_dir: Path, key: dict, demo: DemoSet) -> None:
    files = [demo.reference_onnx, demo.reference_tflite, demo.eval_data, *(c.path for c in demo.candidates)]
    record = {
        "key": key,
        "train_accuracy": demo.train_accuracy,
        "test_accuracy": demo.test_accuracy,
        "candidates": [{**asdict(c), "path": c.path.name} for c in demo.candidates],
        "files": {p.name: file_sha256(p) for p in files},
    }
    tmp = out_dir / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, out_dir / MANIFEST)


def _load_cached(out_dir: Path, key: dict) -> DemoSet | None:
    try:
        record = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not _key_matches(record.get("key", {}), key):
        return None
    files = record.get("files", {})
    if not all((out_dir / name).is_file() and file_sha256(out_dir / name) == sha for name, sha in files.items()):
        return None
    candidates = [Candidate(**{**c, "path": out_dir / c["path"]}) for c in record["candidates"]]
    return DemoSet(out_dir, key["seed"], out_dir / REFERENCE_ONNX, out_dir / REFERENCE_TFLITE, candidates,
                   out_dir / EVAL_NPZ, record["train_accuracy"], record["test_accuracy"], reused=True)
