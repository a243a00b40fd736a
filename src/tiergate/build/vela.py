"""The Ethos-U compile stage's own parts (docs/npu.md): what tiergate.build.compiling needs to compile an artifact with Arm's
Vela for an ethos-u class, beside TVM's.

- the compiler image: containers/vela/compiler.Dockerfile on the amd64 base, ethos-u-vela at the class's
  runtime_version (containers/vela/requirements.txt's wheels installed on the host, as for every image: no pip and no
  network in the build or the compile), tagged `tiergate/vela-compiler:<content hash>`;
- the compile: containers/vela/tiergate_vela_compile.py in a container of it (no network), Vela's arguments from the
  class's [compile] table (accelerator, Vela configuration file, system configuration, memory mode, optimise); it
  writes the model Vela writes (model_vela.tflite), Vela's per-layer and summary CSVs and vela-meta.json (each source
  operator's placement with Vela's reason, the summary's figures);
- the compile cache key: the artifact, the compiler image, and those arguments (tiergate.build.compiling.compile_key);
- what the artifact image holds: the source model (the tier's outputs are LiteRT's reference kernels running it) and
  vela-meta.json beside it (the harness's extra.npu, the describer's runtime graph).
"""

from __future__ import annotations

from pathlib import Path

from tiergate.build.toolchain import Toolchain
from tiergate.images import LABEL

RECIPE, SCRIPT, LOCK = "vela/compiler.Dockerfile", "vela/tiergate_vela_compile.py", "vela/requirements.txt"
META = "vela-meta.json"
MODEL = "model_vela.tflite"
PRODUCT = (MODEL, META, "per-layer.csv", "summary.csv")     # what the compile script writes (error.json otherwise)
IMAGE_REPO = "tiergate/vela-compiler"
MODEL_FORMAT = "tflite"            # the artifact image runs the source model (reference kernels)
TIMEOUT_S = 600
MEMORY = "2g"


def key_parts(dc) -> list[str]:
    """What of the class can change Vela's output (the compile cache key's class part)."""
    return vela_args(dc)


def vela_args(dc) -> list[str]:
    return dc.compile.vela_args()


def command(dc, artifact, shapes: dict) -> list[str]:
    """The compile container's command (Vela takes the model's own shapes: a dynamic batch axis becomes 1)."""
    return ["--model", f"/in/model{Path(artifact.path).suffix}", "--out", "/out", "--", *vela_args(dc)]


def image_files(folder: Path, artifact) -> list[Path]:
    """What the artifact image holds: the source model first (the harness's --model), Vela's record beside it."""
    return [Path(artifact.path), Path(folder) / META]


def labels(meta: dict) -> dict[str, str]:
    summary = meta.get("summary") or {}
    return {f"{LABEL}.compile.accelerator": str(meta.get("accelerator", "")),
            f"{LABEL}.compile.system_config": str(meta.get("system_config", "")),
            f"{LABEL}.compile.memory_mode": str(meta.get("memory_mode", "")),
            f"{LABEL}.compile.vela": str(meta.get("vela_version", "")),
            f"{LABEL}.compile.cycles": str(summary.get("cycles_total", "")),
            f"{LABEL}.model.format": MODEL_FORMAT}


def describe_doc(meta: dict, machine: str = "") -> dict:
    """The describe.json of an artifact compiled by Vela, made on the host from its record (the describer in a run's
    container writes the same from the record beside the model)."""
    return {"ok": True, "runtime": "ethos-u", "machine": machine, "error": "", "vela": meta,
            "versions": {"ethos-u-vela": meta.get("vela_version", "")}}


VELA = Toolchain("Vela", RECIPE, SCRIPT, LOCK, IMAGE_REPO, META, PRODUCT, command,
                 key_parts, lambda dc, artifact, input_shapes=None: {}, image_files, labels,
                 describe_doc, TIMEOUT_S, MEMORY)

