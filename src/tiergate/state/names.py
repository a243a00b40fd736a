"""The home's layout: the names of its folders and files, and where each thing lives under `home()`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tiergate.images import graph_cache_key
from tiergate.paths import home

RUNS, DECISIONS, LOCKS, QUICK, GRAPHS, EXPLAIN, DATA, MLFLOW = (
    "runs", "decisions", "locks", "quick", "runtime-graphs", "explain", "data", "mlflow")
COMPILED = "compiled"
RESULT_FILE = "result.json"
OUTPUTS_FILE = "outputs.npz"
SHARDS_SUFFIX = ".shards"          # runs/<key>.shards/<start>-<stop>/
DECISION_SCHEMA = 1


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
    """The compile cache's folder of an artifact compiled for a class (key: tiergate.build.compiling.compile_key)."""
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
