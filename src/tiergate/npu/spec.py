"""An Ethos-U device class's `[compile]` and `[numerics]` tables (targets/ethos-u*.toml; docs/npu.md).

    runtime = "ethos-u"
    runtime_version = "5.2.0"                       # ethos-u-vela, in the compiler image
    [compile]
    accelerator = "ethos-u55-128"                   # Vela's --accelerator-config
    system_config = "Ethos_U55_High_End_Embedded"   # a [System_Config.NAME] of `config`
    memory_mode = "Shared_Sram"                     # a [Memory_Mode.NAME] of `config`
    config = "Arm/vela.ini"                         # a configuration file Vela ships (--list-config-files)
    optimise = "Performance"                        # or "Size"
    [numerics]
    litert_version = "2.3.0"                        # ai-edge-litert: its reference kernels compute the outputs
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACCELERATORS = ("ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512",
                "ethos-u85-128", "ethos-u85-256", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048")
OPTIMISE = ("Performance", "Size")
KERNELS = ("reference",)
_CONFIG_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_CONFIG_FILE = re.compile(r"^[A-Za-z0-9_.-]{1,64}/[A-Za-z0-9_.-]{1,64}\.ini$")
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+-]{0,31}$")
COMPILE_FIELDS = {"accelerator": str, "system_config": str, "memory_mode": str, "config": str, "optimise": str}
NUMERICS_FIELDS = {"litert_version": str, "kernels": str}


@dataclass(frozen=True)
class VelaSpec:
    """How Vela compiles for the class, and which LiteRT's reference kernels compute its outputs."""

    accelerator: str
    system_config: str
    memory_mode: str
    config: str = "Arm/vela.ini"
    optimise: str = "Performance"
    litert_version: str = ""          # the [numerics] table: ai-edge-litert's version (the runtime image's lock)
    kernels: str = "reference"        # OpResolverType.BUILTIN_REF: LiteRT's reference kernels

    def vela_args(self) -> list[str]:
        return ["--accelerator-config", self.accelerator, "--config", self.config, "--system-config",
                self.system_config, "--memory-mode", self.memory_mode, "--optimise", self.optimise]

    @property
    def numerics(self) -> str:
        """How the decision names the tier's numbers."""
        return f"LiteRT {self.litert_version} reference kernels (OpResolverType.BUILTIN_REF)"


def parse(table: dict | None, numerics: dict | None, bad) -> VelaSpec:
    """The tables of an ethos-u class; `bad(key, problem)` makes the one-line error naming the file and the field."""
    if not isinstance(table, dict):
        raise bad("compile", "is missing: an ethos-u class names its accelerator, system_config and memory_mode "
                  '(e.g. [compile] accelerator = "ethos-u55-128")')
    for key, value in table.items():
        if key not in COMPILE_FIELDS:
            raise bad(f"compile.{key}", f"is unknown (known: {', '.join(COMPILE_FIELDS)})")
        if not isinstance(value, str):
            raise bad(f"compile.{key}", f"must be a string, got {value!r}")
    for key in ("accelerator", "system_config", "memory_mode"):
        if key not in table:
            raise bad(f"compile.{key}", "is missing")
    if table["accelerator"] not in ACCELERATORS:
        raise bad("compile.accelerator", f"must be one of {', '.join(ACCELERATORS)}, got {table['accelerator']!r}")
    for key in ("system_config", "memory_mode"):
        if not _CONFIG_NAME.match(table[key]):
            raise bad(f"compile.{key}", f"must name a section of the Vela configuration file, got {table[key]!r}")
    config = table.get("config", "Arm/vela.ini")
    if not _CONFIG_FILE.match(config):
        raise bad("compile.config", f"must name a configuration file Vela ships, as DIR/NAME.ini, got {config!r}")
    optimise = table.get("optimise", "Performance")
    if optimise not in OPTIMISE:
        raise bad("compile.optimise", f"must be one of {', '.join(OPTIMISE)}, got {optimise!r}")
    numerics = numerics if numerics is not None else {}
    if not isinstance(numerics, dict):
        raise bad("numerics", "must be a table")
    for key, value in numerics.items():
        if key not in NUMERICS_FIELDS:
            raise bad(f"numerics.{key}", f"is unknown (known: {', '.join(NUMERICS_FIELDS)})")
        if not isinstance(value, str):
            raise bad(f"numerics.{key}", f"must be a string, got {value!r}")
    version = numerics.get("litert_version")
    if not version or not _VERSION.match(version):
        raise bad("numerics.litert_version", "is missing: the ai-edge-litert version whose reference kernels compute "
                  'the tier\'s outputs (e.g. [numerics] litert_version = "2.3.0")')
    kernels = numerics.get("kernels", "reference")
    if kernels not in KERNELS:
        raise bad("numerics.kernels", f"must be one of {', '.join(KERNELS)} (LiteRT's reference kernels are the "
                  f"NPU's numeric model), got {kernels!r}")
    return VelaSpec(table["accelerator"], table["system_config"], table["memory_mode"], config, optimise, version,
                    kernels)
