"""The runtime image of a device class (stage 1 of the build: tiergate.build).

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
from dataclasses import dataclass, field
from pathlib import Path

from tiergate.build.engine import (base_python_version, building, cache_dir, content_digest, docker_build,
                                   ensure_base_image, normalise_modes)
from tiergate.errors import EnvironmentProblem, InputError
from tiergate.hashing import file_sha256
from tiergate.images import HOST_CA_BUNDLE, HOST_PIP_CONF, LABEL
from tiergate.paths import containers_dir, qemu_binary
from tiergate.targets import MAX_BUILD_ENV, DeviceClass


DEFAULT_BASE_IMAGE = "python:3.11-slim-bookworm"  # for users with a registry
PIP_MODES = ("host", "image")
RECIPE = "runtime/Dockerfile"      # under containers/: the one runtime recipe
HARNESS_DIR = "harness"             # under containers/: copied whole to /opt/tiergate/harness/
_HARNESS_IGNORE = ("__pycache__", "*.pyc", ".*")


@dataclass(frozen=True)
class RuntimeImage:
    tag: str
    image_id: str
    versions: dict[str, str]
    base_image: str
    reused: bool
    labels: dict[str, str] = field(default_factory=dict)


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
    digest = content_digest([dc.image_runtime, dc.arch, base, base_id, pip_mode, lock, pip_conf,
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
    if len(env) > MAX_BUILD_ENV:  # targets/parsing.py refuses this for catalogue files; a hand-made class may not
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
    return content_digest([f"{p.relative_to(root).as_posix()}:{file_sha256(p)}" for p in harness_files()])


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
            image = docker_build(client, ctx, plan.tag, plan.buildargs, plan.labels, network)
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
    key = content_digest([lock, dc.machine, python])[:20]
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
