"""The device-class catalogue: one TOML file per class under targets/.

Adding a device class is adding a file. Every file is validated on load; an
error names the file and the field.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tiergate.cpunames import emulated_cpu_problem, feature_problem
from tiergate.errors import EnvironmentProblem, InputError
from tiergate.npu.spec import VelaSpec, parse as parse_vela_spec
from tiergate.paths import containers_dir, targets_dir

ARCHES = ("amd64", "arm64")
RUNTIMES = ("onnxruntime", "tflite", "onnxruntime-gpu", "tvm", "ethos-u")
# runtimes whose build step compiles the artifact first (tiergate.compiler; ethos-u through tiergate.vela)
COMPILED_RUNTIMES = ("tvm", "ethos-u")
# the runtime image a class of these runtimes runs in: an Ethos-U class's outputs are LiteRT's reference kernels'
# (docs/npu.md), so it shares the tflite runtime image (its [numerics] litert_version)
IMAGE_RUNTIME = {"ethos-u": "tflite"}
EXECUTIONS = ("native", "emulated", "remote")
MACHINE_OF_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}
FORMAT_OF_RUNTIME = {"onnxruntime": "onnx", "onnxruntime-gpu": "onnx", "tflite": "tflite", "tvm": "onnx", "ethos-u": "tflite"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_CPU = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
_FEATURE = re.compile(r"^[a-z0-9_]{1,32}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The runtime recipe (containers/runtime/Dockerfile) has this many ENV slots for [build] env,
# and sets these variables itself (the harness's contract), so a device class may not.
MAX_BUILD_ENV = 4
RECIPE_ENV = ("PATH", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "HOME")
# [build] defaults per runtime: what a device class without a [build] table gets.
DEFAULT_BUILD_ENV = {
    "onnxruntime-gpu": {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
    "tvm": {"TVM_USE_RUNTIME_LIB": "1"},     # `import tvm` loads the runtime library only (the harness needs no more)
}


@dataclass(frozen=True)
class RuntimeBuild:
    """The runtime recipe's build arguments for a device class (its `[build]` table).

    requirements: the pinned lock containers/requirements/<requirements>.txt (default: the runtime's name);
    env: extra environment baked into the runtime image (default: the runtime's, e.g. NVIDIA variables)."""

    requirements: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def requirements_path(self) -> Path:
        return requirements_path(self.requirements)


def default_evaluation(execution: str) -> Evaluation:
    """An emulated class batches its outputs and makes few single calls (its latency is never gated: they check
    that batching changes no output); the others time every call after the usual warm-up."""
    if execution == "emulated":
        return Evaluation(batch=DEFAULT_EMULATED_EVAL_BATCH, latency_calls=DEFAULT_EMULATED_LATENCY_CALLS,
                          warmup=DEFAULT_EMULATED_WARMUP, latency_pairs=0)
    return Evaluation(batch=0)


def requirements_path(name: str) -> Path:
    return containers_dir() / "requirements" / f"{name}.txt"


def default_build(runtime: str) -> RuntimeBuild:
    return RuntimeBuild(requirements=IMAGE_RUNTIME.get(runtime, runtime), env=dict(DEFAULT_BUILD_ENV.get(runtime, {})))


@dataclass(frozen=True)
class ContainerLimits:
    """The container's limits. `memory` (Docker's size string) is the device's memory: a class file sets it
    with `memory_limit_mb = N` (or, the older spelling, `[container] memory = "2g"`)."""

    memory: str = "2g"
    pids_limit: int = 256
    timeout_s: int = 900

    @property
    def memory_bytes(self) -> int:
        return memory_bytes(self.memory)

    @property
    def memory_mb(self) -> float:
        return self.memory_bytes / (1024 * 1024)


_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
_SIZE = re.compile(r"^([0-9]+)([bkmg]?)$", re.IGNORECASE)


def memory_bytes(size: str) -> int:
    """Bytes of a Docker memory size ("96m", "2g", "512k", "1048576")."""
    match = _SIZE.match(size.strip())
    if not match:
        raise ValueError(f"not a memory size: {size!r} (a number with b, k, m or g)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


DEFAULT_EMULATED_EVAL_BATCH = 64
DEFAULT_LATENCY_CALLS = 16
DEFAULT_EMULATED_LATENCY_CALLS = 4
DEFAULT_LATENCY_PAIRS = 200      # native: the candidate's calls interleaved with its partners' (docs/policy.md)
DEFAULT_WARMUP = 3
DEFAULT_EMULATED_WARMUP = 1
AUTO_SHARD_MIN_SAMPLES = 64     # automatic shards: at least this many samples each


@dataclass(frozen=True)
class Evaluation:
    """How a run of this class evaluates its samples (its `[evaluation]` table).

    batch          samples per call for the outputs (accuracy, drift) where the model's batch dimension
                   is dynamic; latency is then timed on `latency_calls` calls at the class's batch_size,
                   and the batched outputs of those samples must equal their single-call outputs (else
                   every sample runs at batch_size). 0 turns it off: every call is timed. Default: 64 on
                   emulated classes (their latency is never gated), 0 on the others.
    latency_calls  calls timed for latency when batched, spread over the shards (default 16; emulated: 4, all in
                   the first shard: their latency is QEMU time, reported, never gated; the single calls check
                   that the batched outputs equal single-call outputs, and a later shard checks its batched
                   outputs against its cold first call alone).
    warmup         calls before the timed ones, the cold first call included (default 3; emulated: 1, the
                   first call only).
    latency_pairs  after the candidate's run, its calls interleaved with the FP32 reference's and the
                   incumbent's in one process (rotating order), this many rounds at most (default 200; emulated:
                   0, off: QEMU time is not gated); `max_latency_ratio` and `noninferior_latency` are decided on
                   the per-pair ratios' intervals (docs/policy.md).
    shards         containers a tier's samples are split over, merged in sample order; 0: automatic
                   (emulated: the cores available / threads, at most one per `shard_samples` samples; others: 1).
    workers        batched calls made at once in one container (threads of one process, each call with the class's
                   `threads`); 0: automatic (emulated: the cores available / threads where the runtime's calls may
                   run at once, onnxruntime, and every artifact's batch dimension is dynamic; then a run is one
                   container, not shards; others: 1). 1 turns it off: automatic shards, as before.
    shard_samples  automatic shards hold at least this many samples (default 64): a shard pays one interpreter
                   start and session creation under QEMU, so a class whose samples are slow to emulate (an x86
                   class's vector floats) lowers it to spread a run over the cores sooner.
    """

    batch: int = 0
    latency_calls: int = DEFAULT_LATENCY_CALLS
    warmup: int = DEFAULT_WARMUP
    latency_pairs: int = DEFAULT_LATENCY_PAIRS
    shards: int = 0
    shard_samples: int = AUTO_SHARD_MIN_SAMPLES
    workers: int = 0

    def worker_count(self, device_class: "DeviceClass") -> int:
        """Batched calls at once in one container of this class: `workers`, else automatic (emulated: the cores
        available / threads; others: 1). Whether the run can use them (runtime, dynamic batch) is the caller's."""
        if self.workers:
            return self.workers
        if not device_class.emulated:
            return 1
        return max(1, available_cores() // max(device_class.threads, 1))

    def shard_count(self, device_class: "DeviceClass", n_samples: int, requested: int | None = None) -> int:
        """Containers for a run of n samples: `requested` (--shards), else the class's, else automatic."""
        wanted = requested or self.shards
        if not wanted:
            if not device_class.emulated:
                return 1
            wanted = max(1, min(available_cores() // max(device_class.threads, 1),
                                n_samples // self.shard_samples))
        return max(1, min(wanted, n_samples))


@dataclass(frozen=True)
class CpuSpec:
    """The [cpu] table: the features the device's CPU has that its runtime may pick kernels by (`requires`), those
    it does not have (`lacks`), and what a native class does on a host whose CPU differs (`on_mismatch`: "refuse",
    exit 2, or "emulate": run under QEMU with the class's `emulated_cpu`). Names as /proc/cpuinfo spells them."""

    requires: tuple[str, ...] = ()
    lacks: tuple[str, ...] = ()
    on_mismatch: str = "refuse"

    def differences(self, features) -> list[str]:
        """What a CPU with these features does differently from the device: [] when it is the device's."""
        have = set(features)
        missing = [f for f in self.requires if f not in have]
        extra = [f for f in self.lacks if f in have]
        return ([f"lacks {', '.join(missing)}, which the device has"] if missing else []) + \
            ([f"has {', '.join(extra)}, which the device lacks"] if extra else [])


@dataclass(frozen=True)
class CompileSpec:
    """The [compile] table of a class whose runtime compiles the artifact in the build step (tvm; docs/tvm.md):
    `target`, the compiler's target as TVM takes it (a table: kind = "llvm", mcpu, mtriple for a cross target such
    as aarch64-linux-gnu, mattr), and `opt_level` (0-3, TVM's PassContext). The passes switched off are the class's
    `disabled_passes`."""

    target: dict[str, object] = field(default_factory=dict)
    opt_level: int = 3


def available_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class DeviceClass:
    name: str
    tier: str
    arch: str
    runtime: str
    runtime_version: str
    threads: int
    batch_size: int
    execution: str
    docker_host: str
    cost_per_hour: float
    description: str = ""
    gpu: bool = False
    base_image: str | None = None
    limits: ContainerLimits = field(default_factory=ContainerLimits)
    cost_tags: dict[str, str] = field(default_factory=dict)
    source: Path | None = None
    build: RuntimeBuild | None = None  # None: the runtime's defaults (filled in on creation)
    evaluation: Evaluation | None = None  # None: the execution's defaults (filled in on creation)
    emulated_cpu: str | None = None      # emulated classes: the CPU model QEMU presents (QEMU_CPU), e.g. cortex-a76
    cpu: CpuSpec = field(default_factory=lambda: CpuSpec())   # the [cpu] table: what the device's CPU has and lacks
    # optimizer passes switched off in this class's runtime or compiler, by the runtime's own names: onnxruntime's
    # graph transformers (SessionOptions disabled_optimizers), "XNNPACK" for LiteRT's default delegate, TVM's
    # passes (PassContext disabled_pass); `tiergate gate --disable-pass` and `tiergate bisect` set it on the
    # candidate's runs only (docs/bisect.md)
    disabled_passes: tuple[str, ...] = ()
    # the [compile] table: runtimes that compile the artifact only (tvm: CompileSpec; ethos-u: npu.spec.VelaSpec, with
    # its [numerics] table)
    compile: CompileSpec | VelaSpec | None = None

    def __post_init__(self):
        if self.build is None:
            object.__setattr__(self, "build", default_build(self.runtime))
        if self.evaluation is None:
            object.__setattr__(self, "evaluation", default_evaluation(self.execution))

    @property
    def emulated(self) -> bool:
        return self.execution == "emulated"

    @property
    def container_env(self) -> dict[str, str]:
        """Environment every container of this class gets: the emulated CPU model for QEMU user mode (it
        decides which kernels the runtime picks, as the device's own CPU would)."""
        return {"QEMU_CPU": self.emulated_cpu} if self.emulated_cpu else {}

    @property
    def launcher(self) -> list[str]:
        """The command the runtime's Python is started under in this class's containers: QEMU user mode, started
        explicitly, for an emulated x86 CPU (never binfmt_misc for the host's own architecture); [] otherwise
        (arm64 classes are emulated through binfmt_misc, with QEMU_CPU)."""
        if self.emulated and self.arch == "amd64":
            return [EMULATOR_IN_IMAGE, "-cpu", self.emulated_cpu or "qemu64"]
        return []

    @property
    def cpu_key(self) -> str:
        """The CPU a run of this class runs on, for the run and describe cache keys: the emulated model, or the
        local host's CPU (its model and features) for a native class on the local engine."""
        if self.emulated:
            return self.emulated_cpu or "qemu-default"
        if self.docker_host in ("local", None) and self.execution != "remote":
            return host_cpu_key()
        return ""

    @property
    def graph_key(self) -> str:
        """What, beyond the artifact and the image, decides the graph this class's runtime runs: the CPU
        (cpu_key) and the passes switched off (in the describe cache's key)."""
        if not self.disabled_passes:
            return self.cpu_key
        import hashlib

        off = hashlib.sha256("\n".join(sorted(self.disabled_passes)).encode()).hexdigest()[:12]
        return f"{self.cpu_key}-off{off}"

    @property
    def machine(self) -> str:
        """What `uname -m` says on this class's hardware."""
        return MACHINE_OF_ARCH[self.arch]

    @property
    def compiled(self) -> bool:
        """Whether the build step compiles the artifact for this class (its image holds the compiled library)."""
        return self.runtime in COMPILED_RUNTIMES

    @property
    def image_runtime(self) -> str:
        """The runtime whose image the class's runs use (an Ethos-U class: tflite, its reference kernels)."""
        return IMAGE_RUNTIME.get(self.runtime, self.runtime)

    @property
    def image_runtime_version(self) -> str:
        """The version the runtime image's lock is rendered with: the class's runtime_version, or for an Ethos-U
        class (whose runtime_version is Vela's) its [numerics] litert_version."""
        if isinstance(self.compile, VelaSpec):
            return self.compile.litert_version
        return self.runtime_version

    @property
    def artifact_format(self) -> str:
        return FORMAT_OF_RUNTIME[self.runtime]

    @property
    def platform(self) -> str:
        return f"linux/{self.arch}"


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
ON_MISMATCH = ("refuse", "emulate")
EMULATOR_IN_IMAGE = "/opt/tiergate/emulator/qemu-x86_64"   # in the runtime image of an emulated x86 class
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


# --- the CPU behind a class -------------------------------------------------------------------------------

CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=1)
def host_cpu() -> tuple[str, frozenset[str]]:
    """(model name, feature flags) of this machine's CPU as its kernel reports them (/proc/cpuinfo)."""
    model, features = "", frozenset()
    try:
        text = CPUINFO.read_text()
    except OSError:
        return model, features
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu part") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not features:
            features = frozenset(value.split())
    return model, features


def host_cpu_key() -> str:
    model, features = host_cpu()
    return "host-" + hashlib.sha256(("\0".join([model, *sorted(features)])).encode()).hexdigest()[:12]


def cpu_verdict(dc: DeviceClass, features=None) -> tuple[str, str]:
    """How a class runs on this host: ("native" | "emulated" | "refused", why)."""
    if dc.emulated:
        return "emulated", f"QEMU {dc.emulated_cpu or 'default CPU'}"
    if dc.docker_host not in ("local", None) or dc.execution == "remote":
        return "native", f"on {dc.docker_host} (its CPU is reported by its runs)"
    differences = dc.cpu.differences(host_cpu()[1] if features is None else features)
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
