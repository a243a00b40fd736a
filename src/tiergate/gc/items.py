"""What gc looks at (an engine's `Inventory`, what the registry `Needs`) and what it plans (`Item`, `Plan`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from tiergate.gc.common import DEFAULT_KEEP_LAST, human_size, image_key


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: dict[str, str]
    created: datetime | None
    size: int                  # bytes its removal frees (its own layers)


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    labels: dict[str, str]
    state: str                 # created, running, exited, dead, ...
    created: datetime | None
    image_id: str
    volumes: tuple[str, ...] = ()
    size: int = 0


@dataclass(frozen=True)
class VolumeInfo:
    name: str
    labels: dict[str, str]
    created: datetime | None
    size: int = 0


@dataclass(frozen=True)
class Inventory:
    images: tuple[ImageInfo, ...] = ()
    containers: tuple[ContainerInfo, ...] = ()
    volumes: tuple[VolumeInfo, ...] = ()


class Engine(Protocol):
    """The few engine calls gc makes (DockerEngine; a fake in the tests)."""

    def inventory(self) -> Inventory: ...
    def remove_image(self, ref: str) -> None: ...
    def remove_container(self, container_id: str) -> None: ...
    def remove_volume(self, name: str) -> None: ...


@dataclass
class Needs:
    """What the registry needs: artifact sha -> why; `protected` is what promoted aliases need."""

    keep: dict[str, str] = field(default_factory=dict)
    protected: set[str] = field(default_factory=set)
    models: dict[str, str] = field(default_factory=dict)       # registered sha -> model
    images: set[str] = field(default_factory=set)              # image ids the registry's runs name

    def add(self, sha: str | None, why: str, *, protected: bool = False) -> None:
        if not sha:
            return
        if protected and sha not in self.protected:
            self.protected.add(sha)
            self.keep[sha] = why
        else:
            self.keep.setdefault(sha, why)


def registry_needs(registry, keep_last: int = DEFAULT_KEEP_LAST) -> Needs:
    """Aliases (and their references) and the last `keep_last` artifacts of every model."""
    needs = Needs()
    for model in registry.models():
        artifacts = registry.artifacts(model)   # oldest first
        by_sha = {a.sha256: a for a in artifacts}
        needs.models.update({a.sha256: model for a in artifacts})
        for tier, sha in registry.aliases(model).items():
            needs.add(sha, f"promoted: {model}/{tier}", protected=True)
            record = by_sha.get(sha) or registry.find_artifact(sha)
            if record is not None:
                needs.add(record.reference_sha, f"FP32 reference of {model}/{tier}", protected=True)
        for record in artifacts[-keep_last:] if keep_last > 0 else []:
            needs.add(record.sha256, f"one of the last {keep_last} artifacts of {model}")
            needs.add(record.reference_sha, f"reference of a recent artifact of {model}")
    needs.images = {image_key(r.image_id) for r in registry.runs() if r.image_id}
    return needs


@dataclass
class Item:
    kind: str                  # image | run | decision | compiled | mlflow | container | volume
    id: str                    # image id, path, container id, volume name
    name: str                  # what a person reads: tag, folder name, file name
    size: int
    created: datetime | None
    remove: bool
    reason: str
    refs: tuple[str, ...] = ()          # image: the tags to remove it by
    artifact: str | None = None         # the artifact sha it belongs to, where known
    removed: bool = False
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "name": self.name, "size_bytes": self.size,
                "size": human_size(self.size), "created": self.created.isoformat() if self.created else None,
                "action": "remove" if self.remove else "keep", "reason": self.reason,
                "artifact": self.artifact, "removed": self.removed, "error": self.error}


@dataclass
class Plan:
    items: list[Item]
    skipped: list[str] = field(default_factory=list)   # what could not be looked at, and why
    ledger: set[str] = field(default_factory=set)      # image ids still to remove later

    @property
    def removals(self) -> list[Item]:
        return [i for i in self.items if i.remove]

    @property
    def kept(self) -> list[Item]:
        return [i for i in self.items if not i.remove]

    @property
    def errors(self) -> list[Item]:
        return [i for i in self.items if i.error]
