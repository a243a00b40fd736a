"""The catalogue: every class file under targets/ by name (`catalogue`), classes named on a command line
(`resolve`), and how each runs on this host (`cpu_verdict`, `for_this_host`: a native class whose CPU this host does
not have is refused, or emulated where the class says so)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tiergate.errors import EnvironmentProblem, InputError
from tiergate.paths import targets_dir
from tiergate.targets import host as this_host
from tiergate.targets.classes import DeviceClass, default_evaluation
from tiergate.targets.parsing import load_device_class_file


def catalogue(directory: Path | None = None) -> dict[str, DeviceClass]:
    """Every device class in the catalogue folder, by name."""
    directory = directory or targets_dir()
    if not directory.is_dir():
        raise InputError(f"device class catalogue {directory} is not a folder")
    return {dc.name: dc for dc in map(load_device_class_file, sorted(directory.glob("*.toml")))}


def resolve(names: str | list[str], directory: Path | None = None, *, host: bool = True) -> list[DeviceClass]:
    """Device classes by name (a comma-separated string or a list); unknown names are errors. With `host`, each
    as it runs on this host (for_this_host: a native class whose CPU this host does not have is refused)."""
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
    wanted = [n for n in wanted if n]
    if not wanted:
        raise InputError("no device class named (give --targets NAME[,NAME...])")
    known = catalogue(directory)
    missing = [n for n in wanted if n not in known]
    if missing:
        raise InputError(
            f"unknown device class {', '.join(map(repr, missing))}; "
            f"known: {', '.join(sorted(known))}"
        )
    return [for_this_host(known[n]) for n in wanted] if host else [known[n] for n in wanted]


def cpu_verdict(dc: DeviceClass, features=None) -> tuple[str, str]:
    """How a class runs on this host: ("native" | "emulated" | "refused", why)."""
    if dc.emulated:
        return "emulated", f"QEMU {dc.emulated_cpu or 'default CPU'}"
    if dc.docker_host not in ("local", None) or dc.execution == "remote":
        return "native", f"on {dc.docker_host} (its CPU is reported by its runs)"
    differences = dc.cpu.differences(this_host.host_cpu()[1] if features is None else features)
    if not differences:
        return "native", "this host's CPU"
    why = "this host's CPU " + " and ".join(differences)
    if dc.cpu.on_mismatch == "emulate":
        return "emulated", f"{why}: emulating {dc.emulated_cpu}"
    return "refused", why


def for_this_host(dc: DeviceClass) -> DeviceClass:
    """The class as it runs here: a native class on a host whose CPU is not the device's is refused (exit 2) with
    the difference named, or emulated when the class says so ([cpu] on_mismatch = "emulate")."""
    verdict, why = cpu_verdict(dc)
    if verdict == "refused":
        raise EnvironmentProblem(f"device class {dc.name}: {why}, so its runtime would pick kernels the device does "
                                 "not run", hint=f'run it on a host with that CPU, or set [cpu] on_mismatch = '
                                 f'"emulate" and emulated_cpu in {dc.source or dc.name}')
    if verdict == "emulated" and not dc.emulated:
        own = dc.evaluation != default_evaluation(dc.execution)    # an [evaluation] table of its own stays
        return dataclasses.replace(dc, execution="emulated",
                                   evaluation=dc.evaluation if own else default_evaluation("emulated"))
    return dc
