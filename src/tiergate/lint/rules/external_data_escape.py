"""external-data-escape: an ONNX external-data location that is not a plain relative
path inside the artifact's folder. Loading already refuses locations that resolve
outside the folder; this rule also flags absolute paths, '..' and symbolic links
that happen to land inside it today but break (or escape) once the artifact is
copied into an image or another folder."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

RULE = "external-data-escape"
SEVERITY = "error"
DESCRIPTION = "external data location leaves (or may leave) the artifact's folder"


def check(ctx) -> list:
    artifact = ctx.artifact
    folder = Path(artifact.path).resolve().parent
    findings = []
    for location in artifact.external_data:
        problem = location_problem(folder, location)
        if problem:
            findings.append(ctx.finding(RULE, SEVERITY, f"external data location {location!r} {problem}"))
    return findings


def location_problem(folder: Path, location: str) -> str | None:
    path = PurePosixPath(location.replace("\\", "/"))
    if path.is_absolute() or os.path.isabs(location):
        return "is an absolute path: not portable, and may point outside the artifact's folder"
    if ".." in path.parts:
        return "climbs with '..': it may leave the artifact's folder"
    target = folder / location
    if any((folder / Path(*path.parts[:k])).is_symlink() for k in range(1, len(path.parts) + 1)):
        return "goes through a symbolic link: its data lies outside the files copied with the artifact"
    if not os.path.realpath(target).startswith(str(folder) + os.sep):
        return "resolves outside the artifact's folder"
    return None
