"""The counting QEMU: instructions per inference on emulated classes (docs/execution.md, docs/policy.md).

scripts/setup builds a dynamic qemu-user (aarch64, x86_64) with TCG plugins from Debian's QEMU source package,
and tiergate's plugin (containers/qemu-count/tiergate_count.c), into count_dir() with the x86_64 loader and the
libraries they need (lib/). A container of an emulated class on the local engine then gets that folder mounted
read-only at IN_CONTAINER and is started under it: the loader is an x86_64 ELF the host's kernel runs natively in
the container's mount namespace, whatever the image's architecture, and it runs the class's emulator with the
plugin, which counts the guest instructions between the harness's markers (containers/harness/harness_insn.py).
Without the folder (or on a remote engine) runs are not counted, and an instructions limit fails as not measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tiergate.targets import DeviceClass



def count_dir() -> Path:
    """Where scripts/setup puts the counting QEMU: TIERGATE_SYSTEM_DIR/qemu-plugins (default /opt/tiergate)."""
    return Path(os.environ.get("TIERGATE_SYSTEM_DIR") or "/opt/tiergate") / "qemu-plugins"


IN_CONTAINER = "/opt/tiergate-count"
STAMP = "STAMP"               # the build's identity: QEMU source version and the plugin's source hash
OUT_PREFIX = "/tmp/tiergate-insn"
COUNT_ENV = "TIERGATE_COUNT_OUT"    # harness_insn.COUNT_ENV
EMULATOR = {"arm64": "qemu-aarch64", "amd64": "qemu-x86_64"}
# what a counted run's environment adds: Python's string hashes seeded alike in every run (a random seed changes
# dict probing, hence the interpreter's instructions, from run to run)
COUNTED_ENV = {"PYTHONHASHSEED": "0"}
# "1": the guest's memory reads are counted too (reads_per_inference). Off by default: an inline add on every read
# cost 15-30 % of an emulated call's CPU time (measured on PaddleOCR's classifier), where counting instructions
# alone (an add per translated block) cost little: 2 % of a batch-64 loop on 2026-11-27, where the dynamic QEMU
# build itself was 6 % slower than Debian's static one; only an emulated class's first shard is counted.
READS_ENV = "TIERGATE_COUNT_READS"


def reads_counted() -> bool:
    return os.environ.get(READS_ENV) == "1"



PROTOCOL = "4"     # how a counted run is made (markers, environment): a change here is another run (the run key)


@dataclass(frozen=True)
class Counter:
    folder: Path
    stamp: str

    @property
    def key(self) -> str:
        """What a counted run's key names: the build (QEMU version, plugin source) and the protocol."""
        return f"{self.stamp}/{PROTOCOL}" + ("/reads" if reads_counted() else "")

    def launcher(self, dc: DeviceClass) -> list[str]:
        """The command a class's harness is started under (then its Python and the script)."""
        q = IN_CONTAINER
        cpu = ["-cpu", dc.emulated_cpu] if dc.emulated_cpu else ([] if dc.arch == "arm64" else ["-cpu", "qemu64"])
        return [f"{q}/ld-linux-x86-64.so.2", "--library-path", f"{q}/lib", f"{q}/{EMULATOR[dc.arch]}", *cpu,
                "-plugin", f"{q}/libtiergate_count.so,out={OUT_PREFIX},reads={'on' if reads_counted() else 'off'}"]

    def environment(self) -> dict[str, str]:
        """What the harness's environment gets under the counter."""
        return {COUNT_ENV: OUT_PREFIX, READS_ENV: "1" if reads_counted() else "0", **COUNTED_ENV}

    def mount(self) -> dict:
        return {str(self.folder): {"bind": IN_CONTAINER, "mode": "ro"}}


def counter(folder: Path | None = None) -> Counter | None:
    """The counting QEMU set up on this machine, or None."""
    folder = folder or count_dir()
    needed = ["ld-linux-x86-64.so.2", "qemu-aarch64", "qemu-x86_64", "libtiergate_count.so", STAMP]
    if not all((folder / name).is_file() for name in needed):
        return None
    return Counter(folder, (folder / STAMP).read_text().strip())


OFF_ENV = "TIERGATE_NO_COUNT"     # "1": runs are not counted even where the counting QEMU is set up (benchmarks)


def counts(dc: DeviceClass, docker_host: str = "local") -> Counter | None:
    """The counter for this class's runs: emulated classes on the local engine, where it is set up."""
    if not dc.emulated or docker_host != "local" or dc.arch not in EMULATOR or os.environ.get(OFF_ENV) == "1":
        return None
    return counter()


# -- built when first needed: `make demo` (scripts/setup --demo) leaves it out, a policy that asks for instructions
# builds it once (scripts/build-counting-qemu, cached by its STAMP) before the gate's first run
BUILD_SECONDS = 270          # measured on this project's 2-core hosts (docs/execution.md): what the line announces
BUILD_LOG = "/tmp/tiergate-counting-qemu.log"


def needs_build(dcs) -> list[DeviceClass]:
    """The classes among `dcs` that would be counted but find no counting QEMU on this machine."""
    if counter() is not None:
        return []
    return [dc for dc in dcs if dc.emulated and dc.docker_host == "local" and dc.arch in EMULATOR
            and os.environ.get(OFF_ENV) != "1"]


def build_script() -> Path:
    """scripts/build-counting-qemu of tiergate's checkout (what scripts/setup runs)."""
    from tiergate.paths import project_root

    return project_root() / "scripts" / "build-counting-qemu"


def ensure_built(dcs, say) -> None:
    """Build the counting QEMU once when one of `dcs` asks for instructions and none is set up (saying so, with its
    expected time); EnvironmentProblem (exit 2) when it cannot be built here. Two gates at once build it once."""
    import fcntl
    import subprocess

    from tiergate.errors import EnvironmentProblem

    missing = needs_build(dcs)
    if not missing:
        return
    script = build_script()
    names = ", ".join(dc.name for dc in missing)
    if not script.is_file():
        raise EnvironmentProblem(f"instructions are asked for on {names}, and the instruction-counting QEMU is not "
                                 f"set up on this machine", hint="run scripts/setup from tiergate's checkout")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    with open("/tmp/tiergate-counting-build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if counter() is not None:               # another gate built it meanwhile
            return
        say(f"instructions are asked for on {names}: building the instruction-counting QEMU once, from Debian's "
            f"source (about {BUILD_SECONDS // 60} min on 2 cores; log {BUILD_LOG})")
        with open(BUILD_LOG, "w") as log:
            done = subprocess.run([*sudo, "env", f"TIERGATE_SYSTEM_DIR={count_dir().parent}", str(script)],
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or counter() is None:
        raise EnvironmentProblem(f"instructions are asked for on {names}, and the instruction-counting QEMU could "
                                 f"not be built here (exit {done.returncode}; see {BUILD_LOG})",
                                 hint="run scripts/setup as root, or drop the policy's instructions limits")
