"""One container image per device class, with the artifact as the last layer.

Two stages of caching:

1. a runtime image per (recipe, build arguments, arch, pinned lock, base image,
   harness folder, CA bundle, pip settings), built once from the one recipe
   containers/runtime/Dockerfile with the device class's build arguments
   (`[build]` in targets/*.toml: the lock containers/requirements/<name>.txt and
   extra environment such as the NVIDIA variables);
2. a thin artifact image `FROM` it (containers/artifact.Dockerfile) that copies
   the artifact last and carries the labels.

Each tag is a content hash of everything that went into the image, so an
unchanged input gives the same tag and the image is reused without building
(`BuiltImage.reused`). Python packages for the runtime image are, by default,
downloaded on the host for the target platform (`pip download --platform ...
--only-binary=:all:`) and installed offline in the image; `pip_mode="image"`
runs pip inside the build instead (with the CA bundle and pip.conf copied in).
See docs/execution.md for the measurements behind that default.
"""

from __future__ import annotations

import configparser
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker

from tiergate import leases
from tiergate.hashing import file_sha256
from tiergate.errors import EnvironmentProblem, InputError
from tiergate.images import HOST_CA_BUNDLE, HOST_PIP_CONF, LABEL, BuiltImage  # noqa: F401 - re-exported
from tiergate.paths import containers_dir, qemu_binary
from tiergate.artifact.files import artifact_files, onnx_external_files  # noqa: F401 - re-exported
from tiergate.targets import MAX_BUILD_ENV, DeviceClass, resolve

DEFAULT_BASE_IMAGE = "python:3.11-slim-bookworm"  # for users with a registry
PIP_MODES = ("host", "image")
MODEL_DIR = "/opt/tiergate/model"
RECIPE = "runtime/Dockerfile"      # under containers/: the one runtime recipe
HARNESS_DIR = "harness"             # under containers/: copied whole to /opt/tiergate/harness/
_HARNESS_IGNORE = ("__pycache__", "*.pyc", ".*")
_PY_OF_BASE: dict[str, str] = {}


@dataclass(frozen=True)
class RuntimeImage:
    tag: str
    image_id: str
    versions: dict[str, str]
    base_image: str
    reused: bool
    labels: dict[str, str] = field(default_factory=dict)


# --- public entry point ----------------------------------------------------------------


def build_image(device_class: DeviceClass | str, artifact_path: Path | str, *, artifact_sha256: str,
                fingerprint: str = "", base_image: str | None = None, ca_bundle: Path | None = None,
                client=None, pip_mode: str = "host", files: list[Path] | None = None,
                extra_labels: dict[str, str] | None = None) -> BuiltImage:
    """The image that runs `artifact_path` on `device_class`, built or reused. `files` (the model first): what the
    artifact layer holds instead of the artifact's own files (a compiled library: tiergate.compiler), with
    `extra_labels` (its compile key and format)."""
    from tiergate.execution.engine import connect, with_retries  # execution imports build

    dc = _device_class(device_class)
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
            image = _docker_build(client, ctx, tag, {"RUNTIME_IMAGE": runtime.tag}, labels)
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
    digest = _digest([ARTIFACT_RECIPE, file_sha256(containers_dir() / "artifact.Dockerfile"), runtime.tag,
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


def lineage_problems(found: dict[str, str] | None, wanted: dict[str, str]) -> list[str]:
    """How an image's labels differ from the ones its tag was made from (an artifact image's: the artifact's
    sha256, the runtime image, the class; a runtime image's: runtime, arch, base, versions, harness, lock, env;
    every one is in the tag's digest): [] when they match."""
    found = found or {}
    return [f"{key[len(LABEL) + 1:]} is {found.get(key)!r}, not {value!r}"
            for key, value in sorted(wanted.items()) if found.get(key) != value]


def _reusable(found, tag: str, wanted: dict[str, str]) -> bool:
    """An image found under its content-hash tag is used when its labels are the ones the tag was made from;
    another image re-tagged there is built again (the tag then moves to the new one), with a warning."""
    if found is None:
        return False
    problems = lineage_problems(found.labels, wanted)
    if problems:
        print(f"tiergate: warning: the image {tag} is not what its tag names ({'; '.join(problems)}); "
              "building it again", file=sys.stderr)
    return not problems


# --- the runtime image -----------------------------------------------------------------


@dataclass(frozen=True)
class RuntimePlan:
    """Everything that goes into a runtime image, and the tag it hashes to."""

    dc: DeviceClass
    tag: str
    base: str
    base_id: str
    lock: str
    buildargs: dict[str, str]
    ca_bundle: bytes
    pip_conf: str
    pip_mode: str
    extra_ca: bool
    versions: dict[str, str]
    labels: dict[str, str]


def plan_runtime_image(dc: DeviceClass, *, client, base_image: str | None = None,
                       ca_bundle: Path | None = None, pip_mode: str = "host") -> RuntimePlan:
    """The runtime image's inputs and content-hash tag (nothing is built)."""
    if pip_mode not in PIP_MODES:
        raise InputError(f"pip_mode {pip_mode!r}: must be one of {', '.join(PIP_MODES)}")
    recipe = containers_dir() / RECIPE
    if not recipe.is_file():
        raise EnvironmentProblem(f"the runtime recipe {recipe} is missing")
    requirements = dc.build.requirements_path
    if not requirements.is_file():
        raise EnvironmentProblem(f"{dc.name}: the runtime lock {requirements} is missing")
    base = base_image or dc.base_image or DEFAULT_BASE_IMAGE
    base_id = ensure_base_image(client, base, dc)
    lock = render_lock(requirements, dc)
    buildargs = runtime_build_args(dc, base)
    cas = ca_bundle_bytes(ca_bundle)
    pip_conf = image_pip_conf()
    harness_sha = harness_sha256()
    versions = lock_versions(lock, dc)
    emulator = emulator_path(dc)
    digest = _digest([dc.image_runtime, dc.arch, base, base_id, pip_mode, lock, pip_conf,
                      json.dumps(buildargs, sort_keys=True), hashlib.sha256(cas).hexdigest(), harness_sha,
                      file_sha256(recipe)] + ([file_sha256(emulator)] if emulator else []))
    labels = {f"{LABEL}.runtime": dc.image_runtime, f"{LABEL}.arch": dc.arch, f"{LABEL}.base_image": base,
              f"{LABEL}.versions": json.dumps(versions, sort_keys=True), f"{LABEL}.harness.sha256": harness_sha,
              f"{LABEL}.requirements": dc.build.requirements,
              f"{LABEL}.env": json.dumps(dc.build.env, sort_keys=True)}
    if emulator:
        labels[f"{LABEL}.emulator"] = f"{emulator.name} {file_sha256(emulator)[:16]}"
    return RuntimePlan(dc, f"tiergate/runtime-{dc.image_runtime}-{dc.arch}:{digest[:20]}", base, base_id, lock,
                       buildargs, cas, pip_conf, pip_mode, ca_bundle is not None, versions, labels)


def emulator_path(dc: DeviceClass) -> Path | None:
    """The QEMU user-mode binary an emulated x86 class's runtime image holds (scripts/setup fetches it), or None
    when the class needs none."""
    if not dc.launcher:
        return None
    path = qemu_binary(Path(dc.launcher[0]).name)
    if not path.is_file():
        raise EnvironmentProblem(f"{dc.name} emulates its CPU with {path.name}, which is not at {path}",
                                 hint="run scripts/setup (it fetches QEMU 10's qemu-user binaries)")
    return path


def runtime_build_args(dc: DeviceClass, base: str) -> dict[str, str]:
    """The recipe's build arguments for a device class: the base image and the [build] env slots."""
    env = dc.build.env
    if len(env) > MAX_BUILD_ENV:  # targets.py refuses this for catalogue files; a hand-made class may not
        raise InputError(f"{dc.name}: build env has {len(env)} variables; the recipe takes at most {MAX_BUILD_ENV}")
    args = {"BASE_IMAGE": base}
    for n, (name, value) in enumerate(sorted(env.items()), start=1):
        args[f"ENV_{n}_NAME"], args[f"ENV_{n}_VALUE"] = name, value
    return args


def harness_files() -> list[Path]:
    """The files of containers/harness/ that go into the image (no byte-code, no dot files)."""
    root = containers_dir() / HARNESS_DIR
    skip = shutil.ignore_patterns(*_HARNESS_IGNORE)
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(set(dirs) - skip(folder, dirs))
        files += [Path(folder) / n for n in sorted(set(names) - skip(folder, names))]
    return files


def harness_sha256() -> str:
    """One hash over the harness folder: every file's relative path and content."""
    root = containers_dir() / HARNESS_DIR
    return _digest([f"{p.relative_to(root).as_posix()}:{file_sha256(p)}" for p in harness_files()])


def ensure_runtime_image(dc: DeviceClass, *, client, base_image: str | None = None,
                         ca_bundle: Path | None = None, pip_mode: str = "host") -> RuntimeImage:
    """The runtime image for the device class's runtime and arch, built once."""
    plan = plan_runtime_image(dc, client=client, base_image=base_image, ca_bundle=ca_bundle, pip_mode=pip_mode)
    with building(client, plan.tag, plan.labels) as found:
        if found is not None:
            return RuntimeImage(plan.tag, found.id, plan.versions, plan.base, True, dict(found.labels))
        with tempfile.TemporaryDirectory(prefix="tiergate-runtime-") as tmp:
            ctx = Path(tmp)
            _runtime_context(plan, client, ctx)
            network = "host" if plan.pip_mode == "image" else "none"  # host: needs no docker0 bridge
            image = _docker_build(client, ctx, plan.tag, plan.buildargs, plan.labels, network)
    return RuntimeImage(plan.tag, image.id, plan.versions, plan.base, False, dict(image.labels))


def _runtime_context(plan: RuntimePlan, client, ctx: Path) -> None:
    dc = plan.dc
    shutil.copy(containers_dir() / RECIPE, ctx / "Dockerfile")
    (ctx / "requirements.txt").write_text(plan.lock)
    (ctx / "ca-bundle.crt").write_bytes(plan.ca_bundle)
    (ctx / "pip.conf").write_text(plan.pip_conf)
    for name in ("site-packages", "out", "data", "emulator"):
        (ctx / name).mkdir()
    emulator = emulator_path(dc)
    if emulator is not None:
        shutil.copy(emulator, ctx / "emulator" / emulator.name)
    root = containers_dir() / HARNESS_DIR
    for path in harness_files():
        target = ctx / HARNESS_DIR / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    if plan.pip_mode == "host":
        python = base_python_version(client, plan.base, plan.base_id)
        wheels = download_wheels(plan.lock, dc, python, ctx / "ca-bundle.crt" if plan.extra_ca else None)
        install_on_host(plan.lock, wheels, dc, python, ctx / "site-packages")
    normalise_modes(ctx)        # the harness, the packages and the emulator readable by the image's user


def ensure_base_image(client, base: str, dc: DeviceClass) -> str:
    """The base image's id, pulled for the class's platform if it is not local; arch checked."""
    image = _local_image(client, base)
    if image is None:
        try:
            image = client.images.pull(base, platform=dc.platform)
        except docker.errors.DockerException as exc:
            raise EnvironmentProblem(
                f"base image {base} for {dc.name} is not present and cannot be pulled: {_one_line(exc)}",
                hint="run scripts/setup for the offline bases tiergate/base:bookworm-{amd64,arm64}, "
                     "or set base_image") from None
    arch = (image.labels or {}).get(f"{LABEL}.arch") or image.attrs.get("Architecture", "")
    if arch and arch != dc.arch:
        raise EnvironmentProblem(f"base image {base} is for {arch}, but {dc.name} needs {dc.arch}")
    return image.id


def base_python_version(client, base: str, base_id: str) -> str:
    """'3.11': the base image's python3, asked once per base image id."""
    if base_id not in _PY_OF_BASE:
        code = "import sys; print('%d.%d' % sys.version_info[:2])"
        out = client.containers.run(base, ["python3", "-c", code], remove=True, network_mode="none",
                                    entrypoint=[])
        _PY_OF_BASE[base_id] = out.decode().strip()
    return _PY_OF_BASE[base_id]


# --- inputs of the build ---------------------------------------------------------------


def render_lock(requirements: Path, dc: DeviceClass) -> str:
    """A pinned lock (containers/requirements/<name>.txt) with the device class's runtime version filled in (the
    runtime image's: an Ethos-U class's [numerics] litert_version, DeviceClass.image_runtime_version)."""
    text = requirements.read_text()
    return text.replace("{runtime_version}", dc.image_runtime_version)


def lock_versions(lock: str, dc: DeviceClass) -> dict[str, str]:
    """Versions of the runtime package and numpy, read from the lock."""
    pins = {}
    for line in lock.splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    package = {"tflite": "ai-edge-litert", "tvm": "apache-tvm"}.get(dc.image_runtime, dc.image_runtime)
    return {package: pins.get(package, dc.image_runtime_version), "numpy": pins.get("numpy", "")}


def ca_bundle_bytes(extra: Path | None) -> bytes:
    """The host's CA bundle plus an optional extra one (a proxy's CA), as one PEM file."""
    parts = [HOST_CA_BUNDLE.read_bytes()] if HOST_CA_BUNDLE.is_file() else []
    if extra is not None:
        extra = Path(extra)
        if not extra.is_file():
            raise InputError(f"{extra}: CA bundle does not exist")
        data = extra.read_bytes()
        if b"-----BEGIN CERTIFICATE-----" not in data:
            raise InputError(f"{extra}: not a PEM CA bundle (no BEGIN CERTIFICATE block)")
        parts.append(data)
    return b"\n".join(p.rstrip(b"\n") + b"\n" for p in parts)


def image_pip_conf() -> str:
    """pip settings for pip inside a build: the host's index settings, our CA bundle."""
    host = configparser.ConfigParser()
    if HOST_PIP_CONF.is_file():
        try:
            host.read(HOST_PIP_CONF)
        except configparser.Error:
            pass
    lines = ["[global]", "cert = /etc/tiergate/ca-bundle.crt"]
    for key in ("index-url", "extra-index-url", "trusted-host", "timeout"):
        value = host.get("global", key, fallback="")
        urls = [v for v in value.split() if not v.startswith("file:")]
        if urls:
            lines.append(f"{key} = {' '.join(urls)}")
    return "\n".join(lines) + "\n"


def platform_tags(machine: str) -> list[str]:
    legacy = ["manylinux1", "manylinux2010"] if machine == "x86_64" else []
    return [f"{p}_{machine}" for p in (*legacy, "manylinux2014")] + \
           [f"manylinux_2_{minor}_{machine}" for minor in range(5, 37)]


def _pip_target_args(dc: DeviceClass, python: str) -> list[str]:
    args = ["--no-deps", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            "--abi", "cp" + python.replace(".", ""), "--abi", "abi3", "--abi", "none"]
    for tag in platform_tags(dc.machine):
        args += ["--platform", tag]
    return args


def _pip(args: list[str], lock: str, what: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        req.write(lock)
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", *args, "-r", req.name], capture_output=True, text=True)
    finally:
        os.unlink(req.name)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()
        raise EnvironmentProblem(f"pip could not {what}: {lines[-1] if lines else 'exit ' + str(proc.returncode)}")


def install_on_host(lock: str, wheels: Path, dc: DeviceClass, python: str, target: Path) -> None:
    """Unpack the lock's wheels into `target` on the host: no pip (and no QEMU) in the image build.

    Byte-code is compiled by the host's Python when it is the base image's version."""
    host_python = "%d.%d" % sys.version_info[:2]
    args = ["install", "--quiet", "--no-index", "--find-links", str(wheels), "--target", str(target),
            *_pip_target_args(dc, python), *([] if host_python == python else ["--no-compile"])]
    _pip(args, lock, f"install the {dc.runtime} wheels for {dc.machine}")
    (target / ".installed").write_text(lock)


def download_wheels(lock: str, dc: DeviceClass, python: str, cert: Path | None) -> Path:
    """The folder of the lock's wheels for the target platform, downloaded on the host once (cached)."""
    key = _digest([lock, dc.machine, python])[:20]
    folder = cache_dir() / "wheels" / f"{dc.runtime}-{dc.machine}-py{python}-{key}"
    done = folder / ".complete"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "w") as held:        # two builds needing one set download it once
            fcntl.flock(held, fcntl.LOCK_EX)
            if not done.exists():
                args = ["download", "--quiet", "--dest", str(folder), *_pip_target_args(dc, python),
                        *(["--cert", str(cert)] if cert is not None else [])]
                _pip(args, lock, f"download the {dc.runtime} wheels for {dc.machine}")
                done.write_text(lock)
    return folder


def cache_dir() -> Path:
    return Path(os.environ.get("TIERGATE_CACHE_DIR") or Path.home() / ".cache" / "tiergate")


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


# --- the artifact ----------------------------------------------------------------------


# --- docker helpers --------------------------------------------------------------------


def _docker_build(client, ctx: Path, tag: str, buildargs: dict, labels: dict, network: str = "none"):
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
        raise EnvironmentProblem(f"building {tag} failed: {_one_line(exc.msg)}",
                                 hint=" | ".join(tail)[-600:]) from None


@contextmanager
def building(client, tag: str, labels: dict[str, str]):
    """The reusable image `tag` when there is one (None: build it inside the block). A missing image is looked for
    again under the engine's build lock for the tag (leases.building), held through the block: two processes that
    need one new image build it once, and the second reuses the first's."""
    found = _local_image(client, tag)
    if _reusable(found, tag, labels):
        yield found
        return
    with leases.building(str(getattr(getattr(client, "api", None), "base_url", "")), tag):
        found = _local_image(client, tag)
        yield found if _reusable(found, tag, labels) else None


def _local_image(client, name: str):
    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        return None


def _device_class(device_class: DeviceClass | str) -> DeviceClass:
    return resolve([device_class])[0] if isinstance(device_class, str) else device_class


def _digest(parts: list[str]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _one_line(exc) -> str:
    return " ".join(str(exc).split())[:400]
