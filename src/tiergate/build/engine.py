"""What the build package's modules share: a docker build without network, the build lock (two processes that
need one new image build it once), the local image and its reuse by labels, the base image and its Python,
content digests and one-line messages."""

from __future__ import annotations

import hashlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from tiergate.execution.dockersdk import docker

from tiergate import leases
from tiergate.errors import EnvironmentProblem
from tiergate.images import LABEL
from tiergate.targets import DeviceClass, resolve


def docker_build(client, ctx: Path, tag: str, buildargs: dict, labels: dict, network: str = "none"):
    """Build a context; RUN steps get no network unless `network` says so (pip_mode="image": host)."""
    from tiergate.execution.engine import with_retries

    def build():
        image, _ = client.images.build(path=str(ctx), tag=tag, buildargs=buildargs, labels=labels,
                                       rm=True, forcerm=True, pull=False, network_mode=network)
        return image

    try:
        return with_retries(build, what=f"building {tag}")
    except docker.errors.BuildError as exc:
        tail = [str(e.get("stream") or e.get("error") or "").strip() for e in exc.build_log]
        tail = [t for t in tail if t][-6:]
        raise EnvironmentProblem(f"building {tag} failed: {one_line(exc.msg)}",
                                 hint=" | ".join(tail)[-600:]) from None


@contextmanager
def building(client, tag: str, labels: dict[str, str]):
    """The reusable image `tag` when there is one (None: build it inside the block). A missing image is looked for
    again under the engine's build lock for the tag (leases.building), held through the block: two processes that
    need one new image build it once, and the second reuses the first's."""
    found = local_image(client, tag)
    if reusable(found, tag, labels):
        yield found
        return
    with leases.building(str(getattr(getattr(client, "api", None), "base_url", "")), tag):
        found = local_image(client, tag)
        yield found if reusable(found, tag, labels) else None


def local_image(client, name: str):
    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        return None


def reusable(found, tag: str, wanted: dict[str, str]) -> bool:
    """An image found under its content-hash tag is used when its labels are the ones the tag was made from;
    another image re-tagged there is built again (the tag then moves to the new one), with a warning."""
    if found is None:
        return False
    problems = lineage_problems(found.labels, wanted)
    if problems:
        print(f"tiergate: warning: the image {tag} is not what its tag names ({'; '.join(problems)}); "
              "building it again", file=sys.stderr)
    return not problems


def lineage_problems(found: dict[str, str] | None, wanted: dict[str, str]) -> list[str]:
    """How an image's labels differ from the ones its tag was made from (an artifact image's: the artifact's
    sha256, the runtime image, the class; a runtime image's: runtime, arch, base, versions, harness, lock, env;
    every one is in the tag's digest): [] when they match."""
    found = found or {}
    return [f"{key[len(LABEL) + 1:]} is {found.get(key)!r}, not {value!r}"
            for key, value in sorted(wanted.items()) if found.get(key) != value]


def device_class_of(device_class: DeviceClass | str) -> DeviceClass:
    return resolve([device_class])[0] if isinstance(device_class, str) else device_class


def content_digest(parts: list[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def one_line(exc) -> str:
    return " ".join(str(exc).split())[:400]


def ensure_base_image(client, base: str, dc: DeviceClass) -> str:
    """The base image's id, pulled for the class's platform if it is not local; arch checked."""
    image = local_image(client, base)
    if image is None:
        try:
            image = client.images.pull(base, platform=dc.platform)
        except docker.errors.DockerException as exc:
            raise EnvironmentProblem(
                f"base image {base} for {dc.name} is not present and cannot be pulled: {one_line(exc)}",
                hint="run scripts/setup for the offline bases tiergate/base:bookworm-{amd64,arm64}, "
                     "or set base_image") from None
    arch = (image.labels or {}).get(f"{LABEL}.arch") or image.attrs.get("Architecture", "")
    if arch and arch != dc.arch:
        raise EnvironmentProblem(f"base image {base} is for {arch}, but {dc.name} needs {dc.arch}")
    return image.id


_PY_OF_BASE: dict[str, str] = {}


def base_python_version(client, base: str, base_id: str) -> str:
    """'3.11': the base image's python3, asked once per base image id."""
    if base_id not in _PY_OF_BASE:
        code = "import sys; print('%d.%d' % sys.version_info[:2])"
        out = client.containers.run(base, ["python3", "-c", code], remove=True, network_mode="none",
                                    entrypoint=[])
        _PY_OF_BASE[base_id] = out.decode().strip()
    return _PY_OF_BASE[base_id]


def cache_dir() -> Path:
    return Path(os.environ.get("TIERGATE_CACHE_DIR") or Path.home() / ".cache" / "tiergate")


def normalise_modes(root: Path) -> None:
    """Fixed modes for a build context: folders 0755, files 0644 (0755 when the owner may execute them), so an
    image's content never depends on the host's umask or a file's mode."""
    os.chmod(root, 0o755)
    for folder, dirs, names in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
