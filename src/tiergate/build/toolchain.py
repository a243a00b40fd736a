"""What a compiler needs of the compile stage (tiergate.build.compiling): a `Toolchain` (its image, command, key,
files, labels, describe document: TVM's in tvm.py, Vela's in vela.py), the compiler image, and an artifact
compiled for a class."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from tiergate import state
from tiergate.images import COMPILE_KEY_LABEL, LABEL

LIBRARY, META, ERROR = "model.so", state.COMPILE_META, "error.json"      # what the compile script writes
COMPILER_BASE = "tiergate/base:bookworm-amd64"    # the compile runs on x86_64 (cross-linking for aarch64)
KEY_LABEL = COMPILE_KEY_LABEL


@dataclass(frozen=True)
class CompilerImage:
    tag: str
    image_id: str
    reused: bool


@dataclass(frozen=True)
class Toolchain:
    """What one compiler needs of the compile stage: its image (recipe, script, lock, repository), the compile's
    command and the files it writes (its record `meta` among them), the class's part of the cache key, the artifact
    image's files and labels, and the describe document made from the record."""

    name: str                                   # in messages: "TVM cannot compile ..."
    recipe: str
    script: str
    lock: str
    repository: str                             # the compiler image's repository (tag: content hash)
    meta: str                                   # the compile's record (read back, sealed in the cache)
    product: tuple[str, ...]                    # the files the compile writes (ERROR instead when it refuses)
    command: Callable                           # (dc, artifact, shapes) -> the compile container's command
    key_parts: Callable                         # (dc) -> what of the class can change the output
    shapes: Callable                            # (dc, artifact, input_shapes) -> static shapes (or {})
    files: Callable                             # (folder, artifact) -> what the artifact image holds, model first
    labels: Callable                            # (meta) -> the artifact image's labels beyond the key's
    describe: Callable                          # (meta, machine) -> describe.json
    timeout_s: int = 1800
    memory: str = "8g"
    apt: bool = False                           # the recipe runs apt-get (its build needs the host's network)


@dataclass(frozen=True)
class Compiled:
    """An artifact compiled for a class: its cache folder (model.so and tvm-meta.json, or Vela's model and
    vela-meta.json) and what the compile recorded."""

    key: str
    folder: Path
    meta: dict
    compiler: str            # the compiler image's tag
    reused: bool
    seconds: float           # this call's wall time
    tool: Toolchain = field(compare=False)
    artifact_path: Path | None = None

    @property
    def files(self) -> list[Path]:
        """What the artifact image holds: the model first (the harness's --model), the compile's record beside it."""
        return self.tool.files(self.folder, SimpleNamespace(path=self.artifact_path))

    @property
    def labels(self) -> dict[str, str]:
        return {KEY_LABEL: self.key, f"{LABEL}.compile.compiler": self.compiler, **self.tool.labels(self.meta)}

