"""The artifact image: a thin image FROM a class's runtime image (containers/artifact.Dockerfile) holding the
artifact (or a class's compiled library) as its last layer, tagged by the content of everything in it, with
the lineage labels (stage 2 of the build: tiergate.build)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from tiergate.artifact.files import artifact_files
from tiergate.build.engine import (building, content_digest, device_class_of, docker_build, lineage_problems,
                                   normalise_modes)
from tiergate.build.runtime import RuntimeImage, ensure_runtime_image
from tiergate.errors import EnvironmentProblem
from tiergate.hashing import file_sha256
from tiergate.images import LABEL, BuiltImage
from tiergate.paths import containers_dir
from tiergate.targets import DeviceClass


MODEL_DIR = "/opt/tiergate/model"


def build_image(device_class: DeviceClass | str, artifact_path: Path | str, *, artifact_sha256: str,
                fingerprint: str = "", base_image: str | None = None, ca_bundle: Path | None = None,
                client=None, pip_mode: str = "host", files: list[Path] | None = None,
                extra_labels: dict[str, str] | None = None) -> BuiltImage:
    """The image that runs `artifact_path` on `device_class`, built or reused. `files` (the model first): what the
    artifact layer holds instead of the artifact's own files (a compiled library: tiergate.build.compiling), with
    `extra_labels` (its compile key and format)."""
    from tiergate.execution.engine import connect, with_retries  # execution imports build

    dc = device_class_of(device_class)
    files = list(files) if files else artifact_files(dc, Path(artifact_path))
    client = client or with_retries(lambda: connect(dc.docker_host), what=f"connecting to {dc.docker_host}")
    t0 = time.monotonic()
    runtime = ensure_runtime_image(dc, client=client, base_image=base_image, ca_bundle=ca_bundle,
                                   pip_mode=pip_mode)
    labels = {**image_labels(dc, runtime, files[0].name, artifact_sha256, fingerprint), **(extra_labels or {})}
    tag = artifact_image_tag(dc, runtime, labels, files)
    with building(client, tag, labels) as found:
        if found is not None:
            return BuiltImage(tag, found.id, dict(found.labels), True, runtime.tag, runtime.reused,
                              time.monotonic() - t0)
        with tempfile.TemporaryDirectory(prefix="tiergate-artifact-") as tmp:
            ctx = Path(tmp)
            artifact_context(files, ctx)
            image = docker_build(client, ctx, tag, {"RUNTIME_IMAGE": runtime.tag}, labels)
    problems = lineage_problems(image.labels, labels)
    if problems:
        raise EnvironmentProblem(f"the image built as {tag} does not carry its lineage ({'; '.join(problems)})")
    return BuiltImage(tag, image.id, dict(image.labels), False, runtime.tag, runtime.reused,
                      time.monotonic() - t0)


# What decides the artifact image's content beyond its inputs' bytes: bump when the recipe or the context's
# making changes (2: files enter the image with fixed modes, 0644 in 0755 folders, whatever the host's umask).
ARTIFACT_RECIPE = "2"


def artifact_image_tag(dc: DeviceClass, runtime: RuntimeImage, labels: dict[str, str], files: list[Path]) -> str:
    """The artifact image's content-hash tag: the runtime image, the labels, the artifact's files (names and
    bytes), the recipe (containers/artifact.Dockerfile) and ARTIFACT_RECIPE; never the host's file modes."""
    digest = content_digest([ARTIFACT_RECIPE, file_sha256(containers_dir() / "artifact.Dockerfile"), runtime.tag,
                      runtime.image_id, json.dumps(labels, sort_keys=True),
                      *(f"{p.name}:{file_sha256(p)}" for p in files)])
    return f"tiergate/{dc.name}:{digest[:20]}"


def artifact_context(files: list[Path], ctx: Path) -> None:
    """The artifact image's build context: the recipe and the artifact's files (model and external data) under
    model/, readable by the harness's user whatever their modes on the host (a 0600 file from umask 077)."""
    shutil.copyfile(containers_dir() / "artifact.Dockerfile", ctx / "Dockerfile")
    (ctx / "model").mkdir()
    for path in files:
        shutil.copyfile(path, ctx / "model" / path.name)
    normalise_modes(ctx)


def image_labels(dc: DeviceClass, runtime: RuntimeImage, model_name: str, artifact_sha256: str,
                 fingerprint: str) -> dict[str, str]:
    labels = {
        f"{LABEL}.artifact.sha256": artifact_sha256,
        f"{LABEL}.fingerprint": fingerprint,
        f"{LABEL}.device_class": dc.name,
        f"{LABEL}.tier": dc.tier,
        f"{LABEL}.arch": dc.arch,
        f"{LABEL}.execution": dc.execution,
        f"{LABEL}.runtime": dc.runtime,
        f"{LABEL}.runtime.version": dc.runtime_version,
        f"{LABEL}.versions": json.dumps(runtime.versions, sort_keys=True),
        f"{LABEL}.runtime_image": runtime.tag,
        f"{LABEL}.base_image": runtime.base_image,
        f"{LABEL}.model.path": f"{MODEL_DIR}/{model_name}",
        f"{LABEL}.model.format": dc.artifact_format,
        f"{LABEL}.cost_per_hour": f"{dc.cost_per_hour:g}",
    }
    labels.update({f"{LABEL}.cost.{k}": v for k, v in sorted(dc.cost_tags.items())})
    return labels
