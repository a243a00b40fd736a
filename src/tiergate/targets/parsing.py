"""A class file read and validated: every field's type, range and meaning checked on load, every error naming the
file and the field (`load_device_class_file`, `parse_device_class`)."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from tiergate.cpunames import emulated_cpu_problem, feature_problem
from tiergate.errors import InputError
from tiergate.npu.spec import VelaSpec, parse as parse_vela_spec
from tiergate.targets.classes import (ARCHES, COMPILED_RUNTIMES, EXECUTIONS, MAX_BUILD_ENV, ON_MISMATCH, RECIPE_ENV,
                                      RUNTIMES, CompileSpec, ContainerLimits, CpuSpec, DeviceClass, Evaluation,
                                      RuntimeBuild, default_build, default_evaluation, memory_bytes, requirements_path)

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_CPU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
_FEATURE = re.compile(r"^[a-z0-9_]{1,32}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_FIELDS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    # field: (type, required)
    "name": (str, False),
    "tier": (str, True),
    "description": (str, False),
    "arch": (str, True),
    "runtime": (str, True),
    "runtime_version": (str, True),
    "threads": (int, True),
    "batch_size": (int, False),
    "execution": (str, True),
    "docker_host": (str, False),
    "cost_per_hour": ((int, float), True),
    "memory_limit_mb": (int, False),
    "gpu": (bool, False),
    "base_image": (str, False),
    "container": (dict, False),
    "cost_tags": (dict, False),
    "build": (dict, False),
    "evaluation": (dict, False),
    "emulated_cpu": (str, False),
    "cpu": (dict, False),
    "disabled_passes": (list, False),
    "compile": (dict, False),
    "numerics": (dict, False),
}
_CPU_FIELDS = {"requires": list, "lacks": list, "on_mismatch": str}
_BUILD_FIELDS = {"requirements": str, "env": dict}
_EVALUATION_FIELDS = {"batch": int, "latency_calls": int, "warmup": int, "latency_pairs": int, "shards": int,
                      "shard_samples": int, "workers": int}
_LIMIT_FIELDS = {"memory": str, "pids_limit": int, "timeout_s": int}
_CHOICES = {"arch": ARCHES, "runtime": RUNTIMES, "execution": EXECUTIONS}


def _bad(path: Path, key: str, problem: str) -> InputError:
    return InputError(f"device class file {path}: field '{key}' {problem}")


def _check_type(path: Path, key: str, value, expected) -> None:
    if isinstance(value, bool) and expected is not bool and bool not in (
        expected if isinstance(expected, tuple) else (expected,)
    ):
        raise _bad(path, key, f"must be {_type_name(expected)}, not a boolean")
    if not isinstance(value, expected):
        raise _bad(path, key, f"must be {_type_name(expected)}, got {value!r}")


def _type_name(expected) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    names = {"str": "a string", "int": "an integer", "float": "a number",
             "bool": "true or false", "dict": "a table"}
    return " or ".join(names.get(t.__name__, t.__name__) for t in types)


def parse_device_class(path: Path, data: dict) -> DeviceClass:
    """Validate one catalogue entry; every error names the file and the field."""
    for key in data:
        if key not in _FIELDS:
            raise _bad(path, key, f"is unknown (known: {', '.join(sorted(_FIELDS))})")
    for key, (expected, required) in _FIELDS.items():
        if key not in data:
            if required:
                raise _bad(path, key, "is missing")
            continue
        _check_type(path, key, data[key], expected)
    for key, choices in _CHOICES.items():
        if data[key] not in choices:
            raise _bad(path, key, f"must be one of {', '.join(choices)}, got {data[key]!r}")
    name = data.get("name", path.stem)
    if name != path.stem:
        raise _bad(path, "name", f"is {name!r} but the file is named {path.stem!r}")
    if not _NAME.match(name):
        raise _bad(path, "name", "may hold only lower-case letters, digits, '.', '_' and '-'")
    for key in ("threads", "batch_size"):
        if key in data and data[key] < 1:
            raise _bad(path, key, "must be at least 1")
    if data["cost_per_hour"] < 0:
        raise _bad(path, "cost_per_hour", "must not be negative")
    host = data.get("docker_host", "local")
    if host != "local" and not host.startswith(("ssh://", "unix://", "tcp://")):
        raise _bad(path, "docker_host", "must be 'local', ssh://user@host, unix:// or tcp://")
    if data["execution"] == "remote" and host == "local":
        raise _bad(path, "docker_host", "must name the remote engine when execution is 'remote'")
    if data["runtime"] == "onnxruntime-gpu" and not data.get("gpu", False):
        raise _bad(path, "gpu", "must be true for the onnxruntime-gpu runtime")
    limits = _parse_limits(path, data.get("container", {}), data.get("memory_limit_mb"))
    build = _parse_build(path, data["runtime"], data.get("build", {}))
    evaluation = _parse_evaluation(path, data["execution"], data.get("evaluation", {}))
    cpu_spec = _parse_cpu(path, data.get("cpu", {}), data["arch"])
    cpu = data.get("emulated_cpu")
    if cpu is not None:
        if data["execution"] != "emulated" and cpu_spec.on_mismatch != "emulate":
            raise _bad(path, "emulated_cpu", "applies to emulated classes (execution = \"emulated\"), and to native "
                       "ones that emulate on a host whose CPU differs ([cpu] on_mismatch = \"emulate\")")
        if not _CPU.match(cpu):
            raise _bad(path, "emulated_cpu", f"must name a QEMU CPU model (e.g. cortex-a76, Haswell-noTSX), got {cpu!r}")
        unknown = emulated_cpu_problem(cpu, data["arch"])     # the emulator's own list (cpunames)
        if unknown:
            raise _bad(path, "emulated_cpu", f"{cpu!r} {unknown}")
    if cpu_spec.on_mismatch == "emulate" and cpu is None:
        raise _bad(path, "cpu.on_mismatch", "is \"emulate\": name the CPU to emulate in emulated_cpu")
    passes = data.get("disabled_passes", [])
    if not all(isinstance(p, str) and p.strip() for p in passes):
        raise _bad(path, "disabled_passes", "must be a list of pass names (strings)")
    compile_spec = _parse_compile(path, data)
    if compile_spec is not None and "batch" not in data.get("evaluation", {}):
        evaluation = dataclasses.replace(evaluation, batch=0)    # compiled shapes are static: no batched calls
    tags = data.get("cost_tags", {})
    for key, value in tags.items():
        if not isinstance(value, str):
            raise _bad(path, f"cost_tags.{key}", "must be a string")
    return DeviceClass(
        name=name,
        tier=data["tier"],
        description=data.get("description", ""),
        arch=data["arch"],
        runtime=data["runtime"],
        runtime_version=data["runtime_version"],
        threads=data["threads"],
        batch_size=data.get("batch_size", 1),
        execution=data["execution"],
        docker_host=host,
        cost_per_hour=float(data["cost_per_hour"]),
        gpu=data.get("gpu", False),
        base_image=data.get("base_image"),
        limits=limits,
        cost_tags=dict(tags),
        source=path,
        build=build,
        evaluation=evaluation,
        emulated_cpu=cpu,
        cpu=cpu_spec,
        disabled_passes=tuple(passes),
        compile=compile_spec,
    )


_COMPILE_FIELDS = {"target": dict, "opt_level": int}
_TARGET_FIELDS = {"kind": str, "mcpu": str, "mtriple": str, "mattr": list}
_TARGET_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TARGET_ATTR = re.compile(r"^[+-][A-Za-z0-9._]{1,32}$")
TRIPLE_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}     # the first part of a target's mtriple per class arch


def _parse_compile(path: Path, data: dict) -> CompileSpec | VelaSpec | None:
    """The [compile] table: required by a runtime that compiles (tvm, ethos-u), refused by the others."""
    table = data.get("compile")
    if "numerics" in data and data["runtime"] != "ethos-u":
        raise _bad(path, "numerics", f"applies to ethos-u classes, not {data['runtime']}")
    if data["runtime"] == "ethos-u":
        return parse_vela_spec(table, data.get("numerics"), lambda key, problem: _bad(path, key, problem))
    if data["runtime"] not in COMPILED_RUNTIMES:
        if table is not None:
            raise _bad(path, "compile", "applies to runtimes that compile the artifact "
                       f"({', '.join(COMPILED_RUNTIMES)}), not {data['runtime']}")
        return None
    if table is None or "target" not in table:
        raise _bad(path, "compile.target", f"is missing: runtime {data['runtime']} compiles for a target, e.g. "
                   '[compile] target = {kind = "llvm", mcpu = "haswell"}')
    for key, value in table.items():
        if key not in _COMPILE_FIELDS:
            raise _bad(path, f"compile.{key}", f"is unknown (known: {', '.join(_COMPILE_FIELDS)})")
        _check_type(path, f"compile.{key}", value, _COMPILE_FIELDS[key])
    opt_level = table.get("opt_level", 3)
    if not 0 <= opt_level <= 3:
        raise _bad(path, "compile.opt_level", f"must be 0 to 3, got {opt_level}")
    target = table["target"]
    for key, value in target.items():
        if key not in _TARGET_FIELDS:
            raise _bad(path, f"compile.target.{key}", f"is unknown (known: {', '.join(_TARGET_FIELDS)})")
        _check_type(path, f"compile.target.{key}", value, _TARGET_FIELDS[key])
        words = value if isinstance(value, list) else [value]
        pattern = _TARGET_ATTR if key == "mattr" else _TARGET_WORD
        if not all(isinstance(w, str) and pattern.match(w) for w in words):
            what = "attribute list (+avx2, -sve)" if key == "mattr" else "name"
            raise _bad(path, f"compile.target.{key}", f"is not a target {what}: {value!r}")
    if target.get("kind") != "llvm":
        raise _bad(path, "compile.target.kind", f"must be \"llvm\" (CPU code), got {target.get('kind')!r}")
    arch = TRIPLE_ARCH[data["arch"]]
    triple = target.get("mtriple")
    if triple is None and arch != "x86_64":
        raise _bad(path, "compile.target.mtriple", f"is missing: the compile runs on x86_64, so an {data['arch']} "
                   f"class names its target triple (e.g. {arch}-linux-gnu)")
    if triple is not None and str(triple).split("-")[0] != arch:
        raise _bad(path, "compile.target.mtriple", f"is {triple!r}, not an {arch} triple, but the class is "
                   f"{data['arch']}")
    if "batch" in data.get("evaluation", {}) and data["evaluation"]["batch"] > data.get("batch_size", 1):
        raise _bad(path, "evaluation.batch", f"is {data['evaluation']['batch']}, but the compiled shapes are static "
                   f"at batch_size {data.get('batch_size', 1)}: give 0")
    return CompileSpec(target=dict(target), opt_level=opt_level)


def _parse_cpu(path: Path, table: dict, arch: str) -> CpuSpec:
    """The [cpu] table: feature names as /proc/cpuinfo spells them, each one the harness can see (cpunames)."""
    for key, value in table.items():
        if key not in _CPU_FIELDS:
            raise _bad(path, f"cpu.{key}", f"is unknown (known: {', '.join(_CPU_FIELDS)})")
        _check_type(path, f"cpu.{key}", value, _CPU_FIELDS[key])
    for key in ("requires", "lacks"):
        for name in table.get(key, []):
            if not isinstance(name, str) or not _FEATURE.match(name):
                raise _bad(path, f"cpu.{key}", f"must list CPU feature names as /proc/cpuinfo spells them (avx2, "
                           f"avx512_vnni, asimddp, ...), got {name!r}")
            unknown = feature_problem(name, arch)
            if unknown:
                raise _bad(path, f"cpu.{key}", unknown)
    both = set(table.get("requires", [])) & set(table.get("lacks", []))
    if both:
        raise _bad(path, "cpu", f"names {', '.join(sorted(both))} both as required and as lacking")
    on_mismatch = table.get("on_mismatch", "refuse")
    if on_mismatch not in ON_MISMATCH:
        raise _bad(path, "cpu.on_mismatch", f"must be one of {', '.join(ON_MISMATCH)}, got {on_mismatch!r}")
    return CpuSpec(tuple(table.get("requires", [])), tuple(table.get("lacks", [])), on_mismatch)


def _parse_evaluation(path: Path, execution: str, table: dict) -> Evaluation:
    """The [evaluation] table: omitted fields take the execution's defaults."""
    for key, value in table.items():
        if key not in _EVALUATION_FIELDS:
            raise _bad(path, f"evaluation.{key}", f"is unknown (known: {', '.join(_EVALUATION_FIELDS)})")
        _check_type(path, f"evaluation.{key}", value, int)
        if value < 0:
            raise _bad(path, f"evaluation.{key}", "must not be negative")
    for key in ("latency_calls", "warmup", "shard_samples"):
        if table.get(key, 1) < 1:
            raise _bad(path, f"evaluation.{key}", "must be at least 1")
    default = default_evaluation(execution)
    return Evaluation(batch=table.get("batch", default.batch),
                      latency_calls=table.get("latency_calls", default.latency_calls),
                      warmup=table.get("warmup", default.warmup),
                      latency_pairs=table.get("latency_pairs", default.latency_pairs),
                      shards=table.get("shards", default.shards),
                      shard_samples=table.get("shard_samples", default.shard_samples),
                      workers=table.get("workers", default.workers))


def _parse_limits(path: Path, table: dict, memory_limit_mb: int | None) -> ContainerLimits:
    for key, value in table.items():
        if key not in _LIMIT_FIELDS:
            raise _bad(path, f"container.{key}", f"is unknown (known: {', '.join(_LIMIT_FIELDS)})")
        _check_type(path, f"container.{key}", value, _LIMIT_FIELDS[key])
    table = dict(table)
    if "memory" in table:
        try:
            size = memory_bytes(table["memory"])
        except ValueError as exc:
            raise _bad(path, "container.memory", str(exc)) from None
        if size < 6 * 1024 * 1024:
            raise _bad(path, "container.memory", "must be at least 6m (Docker's minimum)")
    if memory_limit_mb is not None:
        if "memory" in table:
            raise _bad(path, "memory_limit_mb", "and [container] memory say the same thing: give one "
                       "(memory_limit_mb)")
        if memory_limit_mb < 6:
            raise _bad(path, "memory_limit_mb", "must be at least 6 (Docker's minimum container memory)")
        table["memory"] = f"{memory_limit_mb}m"
    return ContainerLimits(**table)


def _parse_build(path: Path, runtime: str, table: dict) -> RuntimeBuild:
    """The [build] table: omitted fields take the runtime's defaults; `env` replaces the default env."""
    for key, value in table.items():
        if key not in _BUILD_FIELDS:
            raise _bad(path, f"build.{key}", f"is unknown (known: {', '.join(_BUILD_FIELDS)})")
        _check_type(path, f"build.{key}", value, _BUILD_FIELDS[key])
    default = default_build(runtime)
    requirements = table.get("requirements", default.requirements)
    if not _NAME.match(requirements):
        raise _bad(path, "build.requirements", "must name a file containers/requirements/NAME.txt "
                   "(lower-case letters, digits, '.', '_' and '-')")
    if not requirements_path(requirements).is_file():
        raise _bad(path, "build.requirements", f"names {requirements_path(requirements)}, which does not exist")
    env = table.get("env", default.env)
    if len(env) > MAX_BUILD_ENV:
        raise _bad(path, "build.env", f"has {len(env)} variables; the runtime recipe takes at most {MAX_BUILD_ENV}")
    for key, value in env.items():
        if not _ENV_NAME.match(key):
            raise _bad(path, f"build.env.{key}", "is not a valid environment variable name")
        if key in RECIPE_ENV:
            raise _bad(path, f"build.env.{key}", "is set by the runtime recipe itself")
        if not isinstance(value, str):
            raise _bad(path, f"build.env.{key}", f"must be a string, got {value!r}")
    return RuntimeBuild(requirements=requirements, env=dict(env))


def load_device_class_file(path: Path) -> DeviceClass:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"device class file {path} does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"device class file {path} is not valid TOML: {exc}") from None
    return parse_device_class(path, data)
