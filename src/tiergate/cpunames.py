"""The names a device class may give a CPU, checked where a class is loaded (targets.parse_device_class).

- `emulated_cpu_problem(name, arch)`: `emulated_cpu` must be a model of the emulator's own list: `qemu-aarch64 -cpu
  help` (or `qemu-x86_64`) of the QEMU scripts/setup installs (paths.qemu_binary). An unknown model made both runs
  fail ("unable to find CPU model") and the candidate was REJECTed: an environment fault is exit 2, at load. Where
  that QEMU is not installed the name is not checked here (an emulated run then fails as an environment problem).
- `feature_problem(name, arch)`: each name of `[cpu] requires` / `lacks` must be features the harness can see on that
  architecture (containers/harness/harness_cpu.py: CPUID bits on x86_64, HWCAP/HWCAP2 on aarch64, named as
  /proc/cpuinfo names them): a misspelt name (`avx512vnni`) was silently never present, so `lacks` always held.

Each refusal names the closest known name. Stdlib only; the emulator's list is read once per binary.
"""

from __future__ import annotations

import difflib
import functools
import os
import subprocess

from tiergate import harness_source
from tiergate.paths import qemu_binary

EMULATOR = {"amd64": "qemu-x86_64", "arm64": "qemu-aarch64"}
HARNESS_CPU = "harness_cpu.py"


def closest(name: str, known) -> str:
    """' (did you mean X?)' for the closest known name, or ''."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6) or \
        difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    if not found:
        return ""
    match = next((k for k in known if k.lower() == found[0].lower()), found[0])
    return f" (did you mean {match}?)"


@functools.lru_cache(maxsize=8)
def _models(binary: str, mtime_ns: int) -> frozenset[str]:
    try:
        text = subprocess.run([binary, "-cpu", "help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    models, listing = set(), False
    for line in text.splitlines():
        if line.startswith("Available CPUs"):
            listing = True
            continue
        if listing:
            if not line.startswith(" ") or not line.strip():
                if models:
                    break
                continue
            models.add(line.split()[0])
    return frozenset(models)


def emulator_models(arch: str) -> frozenset[str] | None:
    """The CPU models the emulator for `arch` knows, or None when that emulator is not installed here."""
    binary = qemu_binary(EMULATOR[arch])
    try:
        mtime = os.stat(binary).st_mtime_ns
    except OSError:
        return None
    return _models(str(binary), mtime) or None


def emulated_cpu_problem(name: str, arch: str) -> str | None:
    """Why QEMU would not run `-cpu name` for this architecture (one phrase), or None."""
    models = emulator_models(arch)
    if models is None or name in models:
        return None
    return (f"is not a CPU model {EMULATOR[arch]} knows ({qemu_binary(EMULATOR[arch])} -cpu help lists "
            f"{len(models)}){closest(name, models)}")


def known_features(arch: str) -> frozenset[str] | None:
    """The CPU feature names the harness reports on `arch` (harness_cpu.py's X86_BITS, HWCAP and HWCAP2, read from
    its source: harness_source), or None when its source is not here."""
    try:
        values = harness_source.literals(HARNESS_CPU)
    except (OSError, SyntaxError, ValueError):
        return None
    x86 = values.get("X86_BITS", {})
    arm = tuple(values.get("HWCAP", ())) + tuple(values.get("HWCAP2", ()))
    features = {"amd64": frozenset(x86.values() if isinstance(x86, dict) else ()), "arm64": frozenset(arm)}
    return features.get(arch) or None


def feature_problem(name: str, arch: str) -> str | None:
    """Why `name` is no feature the harness can see on `arch` (one phrase), or None."""
    known = known_features(arch)
    if known is None or name in known:
        return None
    return (f"names {name!r}, not a CPU feature the harness can see on {arch} (names as /proc/cpuinfo spells them)"
            f"{closest(name, known)}")
