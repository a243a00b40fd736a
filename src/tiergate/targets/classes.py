"""A device class and its tables: `DeviceClass` (what a tier is: its architecture, runtime, execution, limits), its
`[build]` (`RuntimeBuild`), `[container]` (`ContainerLimits`), `[evaluation]` (`Evaluation`), `[cpu]` (`CpuSpec`)
and `[compile]` (`CompileSpec`; an Ethos-U class's is npu.spec.VelaSpec), with the defaults a class file omits."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tiergate.npu.spec import VelaSpec
from tiergate.paths import containers_dir
from tiergate.targets import host

ARCHES = ("amd64", "arm64")
RUNTIMES = ("onnxruntime", "tflite", "onnxruntime-gpu", "tvm", "ethos-u")
# runtimes whose build step compiles the artifact first (tiergate.build.compiling; ethos-u through tiergate.build.vela)
COMPILED_RUNTIMES = ("tvm", "ethos-u")
# the runtime image a class of these runtimes runs in: an Ethos-U class's outputs are LiteRT's reference kernels'
# (docs/npu.md), so it shares the tflite runtime image (its [numerics] litert_version)
IMAGE_RUNTIME = {"ethos-u": "tflite"}
EXECUTIONS = ("native", "emulated", "remote")
MACHINE_OF_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}
FORMAT_OF_RUNTIME = {"onnxruntime": "onnx", "onnxruntime-gpu": "onnx", "tflite": "tflite", "tvm": "onnx", "ethos-u": "tflite"}
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


ON_MISMATCH = ("refuse", "emulate")     # [cpu] on_mismatch
EMULATOR_IN_IMAGE = "/opt/tiergate/emulator/qemu-x86_64"   # in the runtime image of an emulated x86 class


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
        return max(1, host.available_cores() // max(device_class.threads, 1))

    def shard_count(self, device_class: "DeviceClass", n_samples: int, requested: int | None = None) -> int:
        """Containers for a run of n samples: `requested` (--shards), else the class's, else automatic."""
        wanted = requested or self.shards
        if not wanted:
            if not device_class.emulated:
                return 1
            wanted = max(1, min(host.available_cores() // max(device_class.threads, 1),
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
            return host.host_cpu_key()
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
