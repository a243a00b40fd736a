"""The device-class catalogue: one TOML file per class under targets/.

Adding a device class is adding a file. Every file is validated on load; an
error names the file and the field.

Modules (this package re-exports their public names: `targets.resolve`, `from tiergate.targets import DeviceClass`):
- classes.py: `DeviceClass` and its tables (`RuntimeBuild`, `ContainerLimits`, `Evaluation`, `CpuSpec`,
  `CompileSpec`), the known architectures, runtimes and executions, and the defaults a class file omits;
- parsing.py: a class file read and validated (`load_device_class_file`, `parse_device_class`);
- catalogue.py: `catalogue()`, `resolve("a,b")`, and how a class runs on this host (`cpu_verdict`, `for_this_host`);
- host.py: this machine's cores and CPU (`available_cores`, `host_cpu`, `host_cpu_key`, read from `CPUINFO`); the
  other modules call them through the module, so a test patches `tiergate.targets.host.NAME`.
"""

from __future__ import annotations

from tiergate.paths import containers_dir, targets_dir  # noqa: F401 - re-exported
from tiergate.targets import host  # noqa: F401 - the module whose names tests patch
from tiergate.targets.catalogue import catalogue, cpu_verdict, for_this_host, resolve
from tiergate.targets.classes import (ARCHES, AUTO_SHARD_MIN_SAMPLES, COMPILED_RUNTIMES, DEFAULT_BUILD_ENV,
                                      DEFAULT_EMULATED_EVAL_BATCH, DEFAULT_EMULATED_LATENCY_CALLS,
                                      DEFAULT_EMULATED_WARMUP, DEFAULT_LATENCY_CALLS, DEFAULT_LATENCY_PAIRS,
                                      DEFAULT_WARMUP, EMULATOR_IN_IMAGE, EXECUTIONS, FORMAT_OF_RUNTIME, IMAGE_RUNTIME,
                                      MACHINE_OF_ARCH, MAX_BUILD_ENV, ON_MISMATCH, RECIPE_ENV, RUNTIMES, CompileSpec,
                                      ContainerLimits, CpuSpec, DeviceClass, Evaluation, RuntimeBuild, default_build,
                                      default_evaluation, memory_bytes, requirements_path)
from tiergate.targets.host import CPUINFO, available_cores, host_cpu, host_cpu_key
from tiergate.targets.parsing import TRIPLE_ARCH, load_device_class_file, parse_device_class

__all__ = [
    "ARCHES", "AUTO_SHARD_MIN_SAMPLES", "COMPILED_RUNTIMES", "CPUINFO", "DEFAULT_BUILD_ENV",
    "DEFAULT_EMULATED_EVAL_BATCH", "DEFAULT_EMULATED_LATENCY_CALLS", "DEFAULT_EMULATED_WARMUP", "DEFAULT_LATENCY_CALLS",
    "DEFAULT_LATENCY_PAIRS", "DEFAULT_WARMUP", "EMULATOR_IN_IMAGE", "EXECUTIONS", "FORMAT_OF_RUNTIME", "IMAGE_RUNTIME",
    "MACHINE_OF_ARCH", "MAX_BUILD_ENV", "ON_MISMATCH", "RECIPE_ENV", "RUNTIMES", "TRIPLE_ARCH", "CompileSpec",
    "ContainerLimits", "CpuSpec", "DeviceClass", "Evaluation", "RuntimeBuild", "available_cores", "catalogue",
    "containers_dir", "cpu_verdict", "default_build", "default_evaluation", "for_this_host", "host", "host_cpu",
    "host_cpu_key", "load_device_class_file", "memory_bytes", "parse_device_class", "requirements_path", "resolve",
    "targets_dir",
]
