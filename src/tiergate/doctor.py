"""Checks that this machine can run the pipeline: engine, emulation, images, GPU, disk."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tiergate.paths import home

BASE_IMAGES = ("tiergate/base:bookworm-amd64", "tiergate/base:bookworm-arm64")
BINFMT_ENTRY = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
MIN_QEMU = (8, 0)        # Debian 12's 7.2 crashes importing onnxruntime (PLATFORM.md)
MIN_FREE_GB = 5.0


@dataclass
class Check:
    name: str
    status: str          # "ok", "warn", "fail", "skip"
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"


def check_engine(client) -> Check:
    if client is None:
        return Check("docker engine", "fail", "no Docker engine answers",
                     "start one: scripts/setup (or: dockerd &), or set DOCKER_HOST")
    info = client.version()
    return Check("docker engine", "ok", f"Docker {info.get('Version', '?')} (API {info.get('ApiVersion', '?')})")


def _qemu_version(interpreter: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([interpreter, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"version (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_emulation_registration(entry: Path = BINFMT_ENTRY) -> Check:
    fix = "register QEMU 10 for arm64: scripts/setup"
    if not entry.exists():
        return Check("arm64 emulation", "fail", "no qemu-aarch64 entry in binfmt_misc", fix)
    text = entry.read_text()
    interpreter = re.search(r"^interpreter (\S+)", text, re.M)
    flags = re.search(r"^flags: (\S*)", text, re.M)
    if not text.startswith("enabled") or not interpreter:
        return Check("arm64 emulation", "fail", "qemu-aarch64 is registered but disabled", fix)
    if not flags or "F" not in flags.group(1):
        return Check("arm64 emulation", "fail", "qemu-aarch64 lacks flag F (not usable in containers)", fix)
    version = _qemu_version(interpreter.group(1))
    if version is None:
        return Check("arm64 emulation", "fail", f"cannot run {interpreter.group(1)} --version", fix)
    shown = f"QEMU {version[0]}.{version[1]} at {interpreter.group(1)}, flags {flags.group(1)}"
    if version < MIN_QEMU:
        return Check("arm64 emulation", "fail", f"{shown}: too old, onnxruntime crashes under it", fix)
    return Check("arm64 emulation", "ok", shown)


def check_arm64_container(client) -> Check:
    name = "arm64 container"
    if client is None:
        return Check(name, "skip", "needs the engine")
    try:
        out = client.containers.run(BASE_IMAGES[1], ["uname", "-m"], remove=True, network_mode="none")
    except Exception as exc:  # docker errors: image missing, exec format error
        return Check(name, "fail", f"could not run uname -m: {str(exc).splitlines()[0][:120]}",
                     "scripts/setup (registers emulation and bootstraps the arm64 base image)")
    machine = out.decode().strip()
    if machine != "aarch64":
        return Check(name, "fail", f"uname -m says {machine!r}, expected aarch64", "scripts/setup")
    return Check(name, "ok", "uname -m in an arm64 container prints aarch64")


def check_base_images(client) -> list[Check]:
    if client is None:
        return [Check(f"image {tag}", "skip", "needs the engine") for tag in BASE_IMAGES]
    checks = []
    for tag in BASE_IMAGES:
        try:
            image = client.images.get(tag)
            size = image.attrs.get("Size", 0) / 1e6
            checks.append(Check(f"image {tag}", "ok", f"{image.short_id}, {size:.0f} MB"))
        except Exception:
            checks.append(Check(f"image {tag}", "fail", "missing", "bootstrap it offline: scripts/setup"))
    return checks


def check_gpu() -> Check:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return Check("gpu", "warn", "no NVIDIA GPU (cuda-gpu-* device classes will be skipped)")
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("gpu", "warn", f"nvidia-smi failed: {exc}")
    return Check("gpu", "ok", out.splitlines()[0] if out else "nvidia-smi found")


def check_counting(folder: Path | None = None) -> Check:
    """The counting QEMU (instructions per inference on emulated classes; tiergate.execution.counting)."""
    from tiergate.execution.counting import count_dir, counter

    found = counter(folder)
    if found is None:
        return Check("instruction counting", "warn", f"no counting QEMU in {folder or count_dir()}: emulated runs "
                     "are not counted and an instructions limit fails as not measured",
                     "scripts/build-counting-qemu (scripts/setup runs it)")
    return Check("instruction counting", "ok", found.stamp)


def check_disk(path: Path | None = None) -> Check:
    if path is None:
        from tiergate.errors import EnvironmentProblem

        try:
            path = home()
        except EnvironmentProblem as exc:         # an unusable home is this check's failure, not the doctor's
            return Check("free disk", "fail", exc.message, exc.hint)
    probe = path if path.exists() else Path.cwd()
    free_gb = shutil.disk_usage(probe).free / 1e9
    if free_gb < MIN_FREE_GB:
        return Check("free disk", "fail", f"{free_gb:.1f} GB free at {probe}",
                     f"free at least {MIN_FREE_GB:.0f} GB (docker image prune)")
    return Check("free disk", "ok", f"{free_gb:.1f} GB free at {probe}")


def check_host_runtimes() -> Check:
    import importlib.metadata as md

    found, missing = [], []
    for dist in ("onnxruntime", "ai-edge-litert"):
        try:
            found.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            missing.append(dist)
    if missing:
        return Check("host runtimes", "warn", f"missing {', '.join(missing)}",
                     "pip install 'tiergate[tflite]' for the host TFLite reference")
    return Check("host runtimes", "ok", ", ".join(found))


def check_cpu() -> list[Check]:
    """The host CPU's features that decide a runtime's kernels, then each shipped class: native, emulated, or
    refused here (its [cpu] table against this CPU), and the emulator an emulated x86 class needs."""
    from tiergate.decision import DECISIVE_FEATURES, cpu_text
    from tiergate.paths import qemu_binary
    from tiergate.targets import EMULATOR_IN_IMAGE, catalogue, cpu_verdict, host_cpu

    model, features = host_cpu()
    shown = {"model": model or "?", "features": sorted(f for f in features if f in DECISIVE_FEATURES)}
    checks = [Check("host cpu", "ok" if features else "warn", cpu_text(shown, limit=len(DECISIVE_FEATURES))
                    or "no CPU features in /proc/cpuinfo")]
    for dc in catalogue().values():
        verdict, why = cpu_verdict(dc, features)
        status = {"native": "ok", "emulated": "ok", "refused": "warn"}[verdict]
        fix = "" if verdict != "refused" else "run it on a host with the device's CPU, or [cpu] on_mismatch = emulate"
        emulator = Path(EMULATOR_IN_IMAGE).name if verdict == "emulated" and dc.arch == "amd64" else None
        if emulator and not qemu_binary(emulator).is_file():
            status, fix = "fail", f"scripts/setup (fetches {emulator})"
        checks.append(Check(f"class {dc.name}", status, f"{verdict}: {why}", fix))
    return checks


def docker_client():
    """A client for the engine named by DOCKER_HOST (or the local socket), or None."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception:
        return None


def run_checks() -> list[Check]:
    client = docker_client()
    checks = [check_engine(client), check_emulation_registration(), check_arm64_container(client)]
    checks += check_base_images(client)
    checks += [check_gpu(), check_counting(), check_disk(), check_host_runtimes()]
    checks += check_cpu()
    return checks


# -- the emulated tiers' setup, which `make demo` leaves running in the background (scripts/setup --demo) --------
SETUP_STATUS, SETUP_LOG = "setup-emulated.status", "setup-emulated.log"
EMULATED_SETUP_TIMEOUT_S = 1800


def _system_dir() -> Path:
    import os

    return Path(os.environ.get("TIERGATE_SYSTEM_DIR") or "/opt/tiergate")


def emulation_ready(client=None) -> bool:
    """Whether arm64 containers can run here now: QEMU registered with binfmt_misc and the arm64 base image."""
    if check_emulation_registration().status != "ok":
        return False
    client = client or docker_client()
    if client is None:
        return False
    return all(c.status == "ok" for c in check_base_images(client)[1:])


def wait_for_emulation(say, timeout_s: float = EMULATED_SETUP_TIMEOUT_S, poll_s: float = 5.0) -> None:
    """Return once the emulated tiers can run, waiting for a background setup while it works (a progress line every
    20 s: its last step and how long it has run); EnvironmentProblem when it failed or none is set up."""
    import time

    from tiergate.errors import EnvironmentProblem

    folder = _system_dir()
    status, log = folder / SETUP_STATUS, folder / SETUP_LOG
    start, said = time.monotonic(), 0.0
    while not emulation_ready():
        fields = status.read_text().split() if status.is_file() else []
        state = fields[0] if fields else ""
        if state == "failed":
            raise EnvironmentProblem(f"the emulated tiers' setup failed ({' '.join(fields[1:])[:200]}); see {log}",
                                     hint="run scripts/setup")
        if state != "running" or time.monotonic() - start > timeout_s:
            raise EnvironmentProblem("the emulated tiers are not set up here (no QEMU registration or arm64 base "
                                     "image)", hint="run scripts/setup (make demo starts it in the background)")
        if time.monotonic() - said >= 20 or not said:
            since = int(time.time() - float(fields[2])) if len(fields) > 2 and fields[2].isdigit() else None
            last = [line for line in (log.read_text(errors="replace").splitlines() if log.is_file() else [])
                    if line.startswith("setup: ")]
            say("waiting for the emulated tiers' setup" + (f" ({since} s so far)" if since is not None else "")
                + (f": {last[-1].removeprefix('setup: ')}" if last else ""))
            said = time.monotonic()
        time.sleep(poll_s)
