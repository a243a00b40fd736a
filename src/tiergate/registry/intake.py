"""Registering a model file: validate it, fingerprint it, store it, record it (with its FP32 reference)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tiergate.artifact.precision import check_reference, is_float, precision_of  # noqa: F401 - re-exported
from tiergate.errors import InputError
from tiergate.registry.db import Registry
from tiergate.registry.names import model_name
from tiergate.registry.records import ArtifactRecord
from tiergate.hashing import file_sha256


@dataclass(frozen=True)
class Registered:
    artifact: ArtifactRecord
    reference: ArtifactRecord


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return value
    raise TypeError(f"cannot record a fingerprint of type {type(value).__name__}")


def _load(path: Path, role: str):
    """The artifact and its fingerprint (JSON); InputError for anything that is not a model."""
    from tiergate.artifact import load_artifact
    from tiergate.fingerprint import fingerprint

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: {role} does not exist or is not a file")
    artifact = load_artifact(path)
    return artifact, _jsonable(fingerprint(artifact))


def register_artifact(registry: Registry, path: Path, *, model: str, reference: Path,
                      parent: str | None = None, tags: dict[str, str] | None = None,
                      config: Path | None = None, at: datetime | None = None) -> Registered:
    """Store and record an artifact and its FP32 reference; everything is checked before anything is stored."""
    model_name(model)
    artifact, fp = _load(Path(path), "artifact")
    ref, ref_fp = _load(Path(reference), "reference")
    check_reference(ref, reference)
    if ref.format != artifact.format:
        raise InputError(f"{reference}: the reference is {ref.format} but the artifact is {artifact.format}; "
                         "give the FP32 reference in the same format (the gate compares them on one runtime)")
    parent_sha = registry.artifact(parent).sha256 if parent else None
    config_sha = _config_sha(config)
    for loaded in (artifact, ref):
        owner = registry.find_artifact(loaded.sha256)
        if owner is not None and owner.model != model:
            raise InputError(f"{loaded.path}: already registered as model {owner.model!r} ({loaded.sha256[:12]})")
    ref_record = _add(registry, ref, ref_fp, model=model, at=at)
    record = _add(registry, artifact, fp, model=model, at=at, parent_sha=parent_sha,
                  reference_sha=ref_record.sha256 if ref_record.sha256 != artifact.sha256 else None,
                  config_sha=config_sha, tags=tags)
    return Registered(artifact=record, reference=ref_record)


def _add(registry: Registry, artifact, fp: dict, *, model: str, at: datetime | None, **fields) -> ArtifactRecord:
    return registry.add_artifact(
        Path(artifact.path), sha256=artifact.sha256, model=model, format=artifact.format,
        precision=precision_of(artifact), fingerprint=fp, external_data=tuple(artifact.external_data),
        at=at, **fields)


def _config_sha(config: Path | None) -> str | None:
    if config is None:
        return None
    config = Path(config)
    if not config.is_file():
        raise InputError(f"{config}: compiler/quantizer configuration file does not exist")
    return file_sha256(config)
