"""Helpers for the gc tests: a TIERGATE_HOME laid out as the gate writes it, and a fake engine."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tiergate.gc import ContainerInfo, ImageInfo, Inventory, VolumeInfo
from tiergate.state import run_key

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)
DATA = hashlib.sha256(b"eval-data").hexdigest()
DC = "x86_64-cpu-onnxruntime"


def sha(name: str) -> str:
    """A fake but well-formed artifact sha256, the same for the same name everywhere in a test."""
    return hashlib.sha256(name.encode()).hexdigest()


def image_id(name: str) -> str:
    return "sha256:" + hashlib.sha256(f"image:{name}".encode()).hexdigest()


def _touch(path: Path, when: datetime) -> None:
    stamp = when.timestamp()
    os.utime(path, (stamp, stamp))


@dataclass
class Home:
    root: Path

    def run(self, artifact: str, *, image: str | None = None, dc: str = DC, when: datetime = NOW - timedelta(days=60),
            status: str = "ok") -> str:
        """A run folder of `artifact` (a name) on its image; returns the folder name (the run key)."""
        image = image or image_id(artifact)
        key = run_key(sha(artifact), dc, image, DATA)
        folder = self.root / "runs" / key
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "outputs.npz").write_bytes(b"\0" * 1000)
        (folder / "result.json").write_text(json.dumps({
            "device_class": dc, "status": status, "artifact_sha256": sha(artifact), "image": f"tiergate/{dc}:x",
            "image_id": image, "data_sha256": DATA, "started_at": when.isoformat()}))
        for path in (folder / "outputs.npz", folder / "result.json", folder):
            _touch(path, when)
        return key

    def decision(self, candidate: str, reference: str, runs: dict[str, str], *, incumbent: str | None = None,
                 when: datetime = NOW - timedelta(days=60), verdict: str = "REJECT", policy: str = "p") -> str:
        """A cached decision JSON naming its inputs; `runs` maps role -> run key (device class DC)."""
        inputs = {"candidate": sha(candidate), "reference": sha(reference),
                  "incumbent": sha(incumbent) if incumbent else None, "data": DATA, "policy": policy, "code": "c",
                  "runs": {f"{role}/{DC}": f"{key}:{'0' * 64}" for role, key in runs.items()},
                  "images": {f"{role}/{DC}": self.image_of(key) for role, key in runs.items()}}
        key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]
        path = self.root / "decisions" / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"schema": 1, "key": key, "created_at": when.isoformat(), "inputs": inputs,
                                    "decision": {"verdict": verdict}}))
        _touch(path, when)
        return key

    def compiled(self, artifact: str | None, key: str, *, when: datetime = NOW - timedelta(days=60)) -> str:
        """A compiled library's folder (a TVM class's compile cache) of `artifact` (a name; None: no source.json,
        as an older tiergate wrote it); returns the folder name (the compile key)."""
        from tiergate.state import write_compile_source

        folder = self.root / "compiled" / key
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.so").write_bytes(b"\0" * 2000)
        (folder / "tvm-meta.json").write_text("{}")
        if artifact is not None:
            write_compile_source(folder, sha(artifact), "x86_64-cpu-tvm", "tiergate/tvm-compiler:c1")
        for path in [*folder.iterdir(), folder]:
            _touch(path, when)
        return key

    def image_of(self, run: str) -> str:
        return json.loads((self.root / "runs" / run / "result.json").read_text())["image_id"]


def artifact_image(name: str, *, when: datetime = NOW - timedelta(days=60), tags: tuple[str, ...] | None = None,
                   runtime_tag: str = "tiergate/runtime-onnxruntime-amd64:r1", size: int = 5000,
                   compile_key: str | None = None) -> ImageInfo:
    labels = {"org.tiergate.artifact.sha256": sha(name), "org.tiergate.device_class": DC,
              "org.tiergate.runtime": "onnxruntime", "org.tiergate.runtime_image": runtime_tag,
              **({"org.tiergate.compile.key": compile_key} if compile_key else {})}
    return ImageInfo(image_id(name), tags if tags is not None else (f"tiergate/{DC}:{sha(name)[:20]}",), labels,
                     when, size)


def runtime_image(tag: str = "tiergate/runtime-onnxruntime-amd64:r1", *,
                  when: datetime = NOW - timedelta(days=60)) -> ImageInfo:
    return ImageInfo(image_id(tag), (tag,), {"org.tiergate.runtime": "onnxruntime", "org.tiergate.arch": "amd64"},
                     when, 300_000_000)


@dataclass
class FakeEngine:
    """An engine in memory: lists what it was given, records (and performs) removals."""

    images: list[ImageInfo] = field(default_factory=list)
    containers: list[ContainerInfo] = field(default_factory=list)
    volumes: list[VolumeInfo] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)   # refs whose removal fails (in use)

    def inventory(self) -> Inventory:
        return Inventory(tuple(self.images), tuple(self.containers), tuple(self.volumes))

    def remove_image(self, ref: str) -> None:
        self.calls.append(("image", ref))
        if ref in self.refuse:
            raise RuntimeError(f"409 Conflict: image {ref} is being used by a container")
        self.images = [i for i in self.images if ref not in i.tags and i.id != ref]

    def remove_container(self, container_id: str) -> None:
        self.calls.append(("container", container_id))
        self.containers = [c for c in self.containers if c.id != container_id]

    def remove_volume(self, name: str) -> None:
        self.calls.append(("volume", name))
        self.volumes = [v for v in self.volumes if v.name != name]
