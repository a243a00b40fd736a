"""The figures a gate decision holds, as plain dataclasses (stdlib only).

Interval and McNemar (tiergate.stats), Estimate (metrics.accuracy), OutputDrift
(metrics.drift), LatencyStats (metrics.latency), DeviceFigures and its op profile
(tiergate.results) are defined here and re-exported where they are computed, so a
saved decision decodes (tiergate.decision) without numpy or scipy: the decision
cache's fast path (tiergate.quickgate) reads them on every unchanged re-run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

MB = 1024 * 1024


@dataclass(frozen=True)
class McNemar:
    n: int
    only_a: int          # pairs where A is right and B wrong
    only_b: int          # pairs where B is right and A wrong
    p_value: float       # exact two-sided: binomial test on the discordant pairs

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float
    method: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Estimate:
    """A proportion with its confidence interval."""

    value: float
    low: float
    high: float
    n: int
    confidence: float


@dataclass(frozen=True)
class OutputDrift:
    n_samples: int
    non_finite: int                      # NaN or Inf elements in the compared output
    max_abs_error: float
    p99_abs_error: float
    relative_l2: float
    sqnr_db: float
    cosine: float                        # mean of per-sample cosine similarities
    cosine_min: float
    top1_agreement: float | None         # None when an output has fewer than two scores per sample
    kl_divergence: float | None          # None unless the reference is a probability output

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LatencyStats:
    n_calls: int
    batch_size: int
    emulated: bool                      # emulated figures are labelled and never gated on absolutely
    mean_ms: float
    std_ms: float
    cov: float                          # coefficient of variation, std / mean (ddof=1)
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p99_reliable: bool                  # enough calls for p99 to mean something
    unstable: bool                      # cov above the policy's limit: report, never trust
    throughput_per_s: float             # single-stream inferences (samples) per second

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class OpTime:
    """Time of one op type, summed over the profiled calls."""

    total_ms: float = 0.0
    calls: int = 0                   # kernel executions summed
    nodes: int = 0                   # nodes of this op type


@dataclass
class NodeTime:
    name: str
    op_type: str
    total_ms: float = 0.0
    provider: str = ""


@dataclass
class OpProfile:
    """Per-op time of one run (harness --profile); `available` False says why in `reason`."""

    available: bool = False
    source: str = ""                 # "onnxruntime profiling JSON", "ai-edge-litert"
    reason: str = ""
    calls: int = 0                   # profiled calls (after one warm-up call)
    by_op_type: dict[str, OpTime] = field(default_factory=dict)   # slowest first
    nodes: list[NodeTime] = field(default_factory=list)           # slowest first

    def top_ops(self, n: int = 5) -> list[tuple[str, float]]:
        """(op type, mean ms per call) of the n op types that take the most time."""
        per_call = max(self.calls, 1)
        ranked = sorted(self.by_op_type.items(), key=lambda kv: -kv[1].total_ms)
        return [(op, t.total_ms / per_call) for op, t in ranked[:n]]


@dataclass
class DeviceFigures:
    """What an edge team sizes a device with, measured by the harness in the run's own process.

    Memory is read from the kernel (VmHWM of the harness process; the container's cgroup
    peak where the run had a container). On an emulated class (QEMU user mode) memory is
    the emulator's process and times are emulated: `emulated` labels them.
    """

    peak_memory_bytes: int | None = None       # peak resident memory of the process, whole run
    baseline_memory_bytes: int | None = None   # before loading: Python, numpy, runtime library, data
    load_memory_bytes: int | None = None       # added by loading the model
    inference_memory_bytes: int | None = None  # added by inference (first call, warm-up, timed loop)
    cgroup_peak_bytes: int | None = None       # the container's cgroup peak (page cache included)
    memory_source: str = ""
    load_ms: float | None = None               # session / interpreter creation incl. EP / delegate set-up
    first_inference_ms: float | None = None    # the cold first call
    artifact_bytes: int | None = None
    emulated: bool = False
    op_profile: OpProfile | None = None
    # guest instructions counted by the counting QEMU's plugin (emulated classes; docs/policy.md): exact and
    # independent of the host's speed and load, unlike the times above
    instructions_per_inference: float | None = None   # median over the timed calls
    instructions_spread: float | None = None          # (max - min) / median over the timed calls
    instructions_calls: int | None = None             # timed calls counted
    reads_per_inference: float | None = None          # guest memory read accesses per call (median)
    load_instructions: int | None = None              # the model's load (session / interpreter creation)
    instructions_source: str = ""

    @property
    def peak_memory_mb(self) -> float | None:
        return None if self.peak_memory_bytes is None else self.peak_memory_bytes / MB

    @property
    def artifact_mb(self) -> float | None:
        return None if self.artifact_bytes is None else self.artifact_bytes / MB


@dataclass(frozen=True)
class Look:
    """One planned look at the first `samples` samples (an early decision); a taken look judges every interval at
    `confidence` (tiergate.stats.look_plan)."""

    index: int                       # 1-based
    samples: int
    taken: bool
    confidence: float | None = None  # 1 - the alpha spent at this look (taken looks only)


SPENDING = ("obrien-fleming", "pocock", "kim-demets")      # alpha-spending families of an early decision (stats)
AUTO_SPENDING = "auto"      # O'Brien-Fleming, else Kim-DeMets; Pocock only by name (orchestrator/early._spending)
