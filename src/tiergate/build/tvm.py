"""TVM's part of the compile stage (docs/tvm.md): its compiler image's recipe and lock, the compile's command
(static shapes from the evaluation data), the class's part of the cache key, the files and labels of the image
of its library, its describe document."""

from __future__ import annotations

import json
from pathlib import Path

from tiergate.build.toolchain import LIBRARY, META, Toolchain
from tiergate.errors import InputError
from tiergate.images import LABEL
from tiergate.targets import DeviceClass


RECIPE, SCRIPT, LOCK = "tvm/compiler.Dockerfile", "tvm/tiergate_tvm_compile.py", "tvm/requirements.txt"
COMPILE_TIMEOUT_S = 1800
COMPILE_MEMORY = "8g"
MODEL_FORMAT = "tvm-library"          # the artifact image's model.format label for a compiled library


def labels(meta: dict) -> dict[str, str]:
    return {f"{LABEL}.compile.target": json.dumps(meta.get("target", {}), sort_keys=True),
            f"{LABEL}.compile.opt_level": str(meta.get("opt_level", "")),
            f"{LABEL}.compile.disabled_passes": json.dumps(meta.get("disabled_passes", [])),
            f"{LABEL}.compile.passes": str(len(meta.get("passes", []))),
            f"{LABEL}.model.format": MODEL_FORMAT}


def static_shapes(dc: DeviceClass, artifact, input_shapes: dict | None = None) -> dict[str, list[int]]:
    """Each model input's static shape for the compile: the data's (`input_shapes`, EvalData.call_shapes: the sample
    axis at the class's batch_size), else the model's own, a symbolic first dimension at batch_size. InputError when a
    dimension stays unknown (the gate knows it from the data; inspect cannot)."""
    out = {}
    for spec in artifact.inputs:
        given = (input_shapes or {}).get(spec.name)
        if given is not None:
            out[spec.name] = [dc.batch_size if d is None else int(d) for d in given]
            continue
        shape = [d if isinstance(d, int) and d > 0 else (dc.batch_size if i == 0 else None)
                 for i, d in enumerate(spec.shape)]
        if any(d is None for d in shape):
            dims = ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in spec.shape)
            raise InputError(f"{dc.name}: TVM compiles static shapes, and input {spec.name!r} [{dims}] has "
                             "dimensions that only evaluation data fix (tiergate gate takes them from its --data)")
        out[spec.name] = shape
    return out


def key_parts(dc: DeviceClass) -> list[str]:
    spec = dc.compile
    return [json.dumps(spec.target, sort_keys=True), str(spec.opt_level), json.dumps(sorted(dc.disabled_passes))]


def command(dc: DeviceClass, artifact, shapes: dict) -> list[str]:
    spec = dc.compile
    command = ["--model", f"/in/model{Path(artifact.path).suffix}", "--out", "/out",
               "--target", json.dumps(spec.target, sort_keys=True), "--opt-level", str(spec.opt_level)]
    command += [arg for name in sorted(dc.disabled_passes) for arg in ("--disable-pass", name)]
    return command + [f"--shape={name}={','.join(map(str, dims))}" for name, dims in sorted(shapes.items())]


def files(folder: Path, artifact) -> list[Path]:
    return [Path(folder) / LIBRARY, Path(folder) / META]


def describe_doc(meta: dict, machine: str = "") -> dict:
    """The describe.json of a compiled artifact, made on the host from its compile record (the describer in a run's
    container writes the same from the record beside the library)."""
    return {"ok": True, "runtime": "tvm", "machine": machine, "error": "", "tvm": meta,
            "versions": {"tvm": meta.get("tvm_version", "")}}


TVM = Toolchain("TVM", RECIPE, SCRIPT, LOCK, "tiergate/tvm-compiler", META, (LIBRARY, META), command,
                key_parts, static_shapes, files, labels, lambda meta, machine="": describe_doc(meta, machine),
                COMPILE_TIMEOUT_S, COMPILE_MEMORY, apt=True)
