"""The runtime graph of one artifact on one device class, produced inside that class's image.

`describe_runtime(artifact, dc, image)` runs containers/harness/tiergate_describe.py in the
class's runtime image (same confinement as a harness run: no network, read-only root,
non-root, limits and timeout of the class) and returns a `RuntimeGraph`
(tiergate.runtime_graph). The describer and the artifact travel in the job's input volume,
so any image of the runtime serves, on any engine.

Cached under TIERGATE_HOME/runtime-graphs/ by (artifact sha256, image id, describer
sha256): one container run per tier per artifact, reused by inspect, the gate and the
report. A folder appears there only complete (written aside, then renamed).

`runtime_intake(artifact, dc, image)` is what a gate's intake calls: the RuntimeGraph and
the lint findings judged on it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from tiergate.errors import InfrastructureFault, InputError
from tiergate.execution.base import Job, last_line, python_entrypoint
from tiergate.execution.docker_backend import DockerBackend, _job_volumes, _run, download, upload
from tiergate.execution.engine import connect, with_retries
from tiergate.hashing import file_sha256
from tiergate.images import DESCRIBER, LABEL, BuiltImage, graph_cache_key
from tiergate import state
from tiergate.paths import containers_dir
from tiergate.runtime_graph import DESCRIBE_FILE, RuntimeGraph, described_level, parse_describe

INPUT_DIR = "/data"
CACHE_DIR = state.GRAPHS


def describer_path() -> Path:
    return containers_dir() / DESCRIBER


def cache_key(artifact_sha256: str, image_id: str, cpu: str | None = None) -> str:
    return graph_cache_key(artifact_sha256, image_id, file_sha256(describer_path()), cpu)


def describe_runtime(artifact, dc, image: str, *, client=None, refresh: bool = False) -> RuntimeGraph:
    """The RuntimeGraph of `artifact` (a loaded Artifact) on device class `dc`, run in `image`
    (a runtime image tag or id, e.g. BuiltImage.runtime_tag), from the cache when it holds one."""
    own_client = client is None
    if own_client:
        client = with_retries(lambda: connect(dc.docker_host), what=f"connecting to {dc.docker_host}")
    try:
        found = client.images.get(image)
        image_id = found.id
        folder = state.graph_folder(artifact.sha256, image_id, file_sha256(describer_path()), dc.graph_key)
        meta = dict(target=dc.name, tier=dc.tier, runtime=dc.runtime, emulated=dc.emulated, image=image,
                    image_id=image_id, artifact_sha256=artifact.sha256, source=Path(artifact.path))
        if not refresh and state.cached_folder(folder, "runtime graph"):
            try:
                return parse_describe(folder, cached=True, seconds=_seconds(folder), **meta)
            except (InputError, ValueError, KeyError, TypeError, AttributeError) as exc:   # sealed, but another shape
                state.discard_folder(folder, "runtime graph", f"it cannot be read ({type(exc).__name__})")
        elif refresh:
            shutil.rmtree(folder, ignore_errors=True)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="tiergate-describe-") as tmp:
            work = Path(tmp) / "out"
            work.mkdir()
            with_retries(lambda: _attempt(client, dc, image, artifact, work), what=f"describing on {dc.name}")
            seconds = time.monotonic() - t0
            (work / "seconds").write_text(f"{seconds:.3f}")
            _publish(work, folder)
        return parse_describe(folder, seconds=seconds, **meta)
    finally:
        if own_client:
            client.close()


def runtime_intake(artifact, dc, image: str, *, client=None) -> tuple[RuntimeGraph, list]:
    """For the gate's intake: the tier's RuntimeGraph and the findings judged on it (and on the file
    where the runtime graph has nothing to say). Findings judged on the runtime name the tier."""
    from tiergate.lint import lint

    graph = describe_runtime(artifact, dc, image, client=client)
    return graph, lint(artifact, dc, runtime=graph)


def _seconds(folder: Path) -> float:
    try:
        return float((folder / "seconds").read_text())
    except (OSError, ValueError):
        return 0.0


def _publish(work: Path, folder: Path) -> None:
    """Copy the finished folder beside its place and put it in the cache (state.publish_folder: one rename, with
    a sealed manifest that the next read verifies)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = state.part_path(folder)
    shutil.copytree(work, staging)
    try:
        state.publish_folder(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _files(artifact) -> list[tuple[Path, str]]:
    """The artifact (and its ONNX external data) with the names they get in the input volume."""
    path = Path(artifact.path)
    files = [(path, "model" + path.suffix)]
    for location in artifact.external_data:
        files.append((path.parent / location, location))
    return files + [(describer_path(), "tiergate_describe.py")]


def _attempt(client, dc, image: str, artifact, work: Path) -> None:
    model = f"{INPUT_DIR}/model{Path(artifact.path).suffix}"
    # the harness run's confinement (DockerBackend.spec), with the describer as the command
    job = Job(device_class=dc, data_npz=Path(os.devnull), out_dir=work,
              image=BuiltImage(image, "", {f"{LABEL}.model.path": model}, True))
    with _job_volumes(client) as (data_volume, out_volume):
        _upload(client, image, data_volume, _files(artifact))
        spec = DockerBackend(dc.docker_host, gpu=dc.gpu).spec(job, data_volume, out_volume)
        spec.update(entrypoint=python_entrypoint(dc, f"{INPUT_DIR}/tiergate_describe.py"),
                    command=["--runtime", dc.runtime, "--model", model, "--out", "/out",
                             "--threads", str(dc.threads),
                             *(arg for name in dc.disabled_passes for arg in ("--disable", name))])
        container = client.containers.create(**spec)
        try:
            reason, log_tail, oom = _run(container, job)
            _download(container, work)
        finally:
            container.remove(force=True)
    if (work / DESCRIBE_FILE).is_file():
        return  # described, or refused by the runtime (its message is in describe.json)
    # the describer exiting with an error, or killed at the class's memory limit, is about this artifact on this
    # class (a finding, and the run says the same); anything else may be the engine's (retried)
    raise_for = InputError if reason and ("exited with code" in reason or oom) else InfrastructureFault
    detail = last_line(log_tail) or reason or "no output"
    raise raise_for(f"{dc.name}: the runtime describer failed in {image}: {reason or 'no describe.json'} ({detail})")


def _upload(client, image: str, volume: str, files: list[tuple[Path, str]]) -> None:
    upload(client, image, volume, files, INPUT_DIR)


def _download(container, work: Path) -> None:
    download(container, work, lambda name: name == DESCRIBE_FILE or described_level(name))