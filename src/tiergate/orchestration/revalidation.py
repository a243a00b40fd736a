"""What a triggered revalidation needs from the registry before gating a registered artifact.

The artifact comes by sha256 (or the event's resource id `tiergate.artifact.<sha256>`);
its FP32 reference, the artifact currently promoted on the first tier (the
incumbent, for the A/B test) and the model's previous artifact (for the diff) come
from the registry, copied out of the content-addressed store.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tiergate.errors import InputError
from tiergate.registry import ArtifactRecord, Registry
from tiergate.targets import DeviceClass, catalogue, resolve

RESOURCE_PREFIX = "tiergate.artifact."


@dataclass
class Prepared:
    record: ArtifactRecord
    device_classes: list[DeviceClass]
    paths: dict[str, Path]                 # role -> model file (candidate, reference, incumbent)
    shas: dict[str, str]                   # role -> sha256
    previous: tuple[Path, str] | None      # the model's previous artifact (file, sha256), for the diff


def artifact_sha(artifact: str) -> str:
    """A sha256 (or unique prefix) from a sha or the event resource id `tiergate.artifact.<sha>`."""
    text = artifact.strip()
    return text[len(RESOURCE_PREFIX):] if text.startswith(RESOURCE_PREFIX) else text


def device_classes_for(fmt: str, targets: str | list[str] | None) -> list[DeviceClass]:
    """The named device classes (default: every non-GPU class) whose runtime takes this format."""
    pool = resolve(targets) if targets else [dc for dc in catalogue().values() if not dc.gpu]
    chosen = [dc for dc in pool if dc.artifact_format == fmt]
    if not chosen:
        names = ", ".join(dc.name for dc in pool)
        raise InputError(f"no device class among {names} runs {fmt} artifacts")
    return chosen


def prepare(registry: Registry, artifact: str, targets: str | list[str] | None, work_dir: Path) -> Prepared:
    record = registry.artifact(artifact_sha(artifact))
    reference = registry.artifact(record.reference_sha) if record.reference_sha else record
    device_classes = device_classes_for(record.format, targets)
    records = {"candidate": record, "reference": reference}
    incumbent = registry.alias(record.model, device_classes[0].tier)
    if incumbent is not None and incumbent.format == record.format and incumbent.sha256 != record.sha256:
        records["incumbent"] = incumbent
    paths = {role: fetch(registry, r, work_dir) for role, r in records.items()}
    previous = previous_artifact(registry, record)
    return Prepared(record, device_classes, paths, {role: r.sha256 for role, r in records.items()},
                    (fetch(registry, previous, work_dir), previous.sha256) if previous else None)


def previous_artifact(registry: Registry, record: ArtifactRecord) -> ArtifactRecord | None:
    """The parent, else the model's last candidate of the same format registered before this one."""
    if record.parent_sha:
        return registry.find_artifact(record.parent_sha)
    earlier = [a for a in registry.artifacts(record.model)
               if a.registered_at <= record.registered_at and a.sha256 != record.sha256]
    candidates = [a for a in earlier if a.reference_sha and a.format == record.format]
    return candidates[-1] if candidates else None


def fetch(registry: Registry, record: ArtifactRecord, work_dir: Path) -> Path:
    """The stored artifact, copied once into work_dir/artifacts/<sha256>/."""
    dest = work_dir / "artifacts" / record.sha256
    model = dest / record.store_key.rsplit("/", 1)[1]
    return model if model.is_file() else registry.fetch_artifact(record.sha256, dest)
