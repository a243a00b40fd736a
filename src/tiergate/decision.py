"""The gate decision's types: Decision, Check, TargetMetrics, TaskMetric, ABResult, DriftMatrix.

Stdlib only (with tiergate.figures, codec, fmt and policy): a saved decision decodes and
renders (reports.markdown, reports.junit, the CLI tables) without numpy or scipy, so an
unchanged re-run answered from the decision cache (tiergate.quickgate) imports neither.
The decision is computed in tiergate.gate, which re-exports everything here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from tiergate.codec import decode, encode
from tiergate.errors import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_OK, InputError
from tiergate.figures import DeviceFigures, Estimate, Interval, LatencyStats, Look, McNemar, OutputDrift
from tiergate.fmt import number
from tiergate.outputs.kind import OutputKind
from tiergate.policy import Thresholds

PROMOTE, REJECT, INCONCLUSIVE = "PROMOTE", "REJECT", "INCONCLUSIVE"
VERDICT_EXIT = {PROMOTE: EXIT_OK, REJECT: EXIT_FAIL, INCONCLUSIVE: EXIT_INCONCLUSIVE}
ALL_CLASSES = "*"          # the device class of a check that is not about one (the signature)
SCHEMA = 2   # decision JSON shape (docs/json-shapes.md); 2: exact round trip, non-finite floats as strings


@dataclass(frozen=True)
class Check:
    device_class: str
    tier: str
    name: str                        # accuracy_ratio, cosine, sqnr_db, latency_p99_ms, run, ...
    value: float | str | None
    threshold: float | str | None
    op: str                          # how value must compare to threshold: ">=", "<=", ">", "=="
    passed: bool
    output: str | None = None        # the model output checked, for per-output checks
    detail: str = ""
    interval: Interval | None = None    # task metrics: the value's confidence interval
    inconclusive: bool = False                # the interval straddles the threshold (passed is False)
    samples_needed: int | None = None         # when inconclusive: samples to decide at the observed effect

    @property
    def label(self) -> str:
        return f"{self.name}[{self.output}]" if self.output else self.name

    @property
    def outcome(self) -> str:
        return "pass" if self.passed else ("inconclusive" if self.inconclusive else "fail")

    def to_json(self) -> dict:
        return {**encode(self), "label": self.label}

    @classmethod
    def from_json(cls, data: dict) -> "Check":
        return decode(cls, data)

    def sentence(self) -> str:
        where = "all device classes" if self.device_class == ALL_CLASSES else f"{self.device_class} ({self.tier})"
        text = f"{where}: {self.label} is {_fmt(self.value)}"
        if self.interval is not None:
            text += f" ({self.interval.confidence:.0%} CI [{_fmt(self.interval.low)}, {_fmt(self.interval.high)}])"
        if self.threshold is not None:
            text += f", must be {self.op} {_fmt(self.threshold)}"
        if self.inconclusive:
            text += ": inconclusive, " + (f"needs about {self.samples_needed} samples at the observed effect"
                                          if self.samples_needed else "no sample size decides at the observed effect")
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class ABResult:
    """A/B against the incumbent on one device class: per-sample correctness basis and the statistics."""

    correctness: str                                  # "labels" or "agreement with FP32 top-1"
    output: str
    mcnemar: McNemar
    accuracy_difference: Interval               # candidate - incumbent
    latency_ratio: Interval | None = None       # candidate / incumbent mean latency


@dataclass(frozen=True)
class TaskMetric:
    """One task metric on one device class: candidate and FP32 reference values, and their ratio's interval."""

    name: str
    output: str | None
    n: int
    candidate: float
    reference: float
    ratio: Interval               # candidate / reference, paired bootstrap over samples
    op: str                             # ">=" (higher is better) or "<=" (errors)
    threshold: float | None
    outcome: str                        # pass, fail, inconclusive, or "reported" (no threshold)
    samples_needed: int | None = None
    source: str = ""                    # FILE.py:FUNCTION of a user metric


@dataclass
class TargetMetrics:
    """Everything computed for one device class, failed checks or not."""

    device_class: str
    tier: str
    execution: str
    emulated: bool
    candidate_status: str
    reference_status: str
    thresholds: Thresholds
    outputs: dict[str, OutputDrift] = field(default_factory=dict)
    label_output: str | None = None
    accuracy: dict[str, Estimate] = field(default_factory=dict)       # candidate / reference / incumbent
    latency: dict[str, LatencyStats] = field(default_factory=dict)    # candidate / reference / incumbent
    latency_ratio_vs_reference: float | None = None                   # candidate / reference: the median
                                                                      # per-pair ratio of interleaved calls
                                                                      # where paired, else the means' ratio
    latency_ratio_interval: Interval | None = None                    # its interval (interleaved pairs only)
    latency_pairs: int = 0                                            # interleaved call pairs it is from
    cost_per_1k: dict[str, float] = field(default_factory=dict)       # candidate / reference (real hardware)
    ab: ABResult | None = None                                        # A/B against the incumbent
    device: dict[str, DeviceFigures] = field(default_factory=dict)    # candidate / reference / incumbent figures
    device_ratios: dict[str, float] = field(default_factory=dict)     # <figure>_ratio[_vs_incumbent]: candidate / other
    task: dict[str, TaskMetric] = field(default_factory=dict)         # task metrics by name
    kinds: dict[str, OutputKind] = field(default_factory=dict)        # what each output is (tiergate.outputs)
    # an NPU tier (docs/npu.md): Vela's placement and estimate per side (candidate / reference / incumbent), the
    # placement's diff against the incumbent's ("diff") and what computed the outputs ("numerics")
    npu: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return encode(self)

    @classmethod
    def from_json(cls, data: dict) -> "TargetMetrics":
        return decode(cls, data)


@dataclass
class DriftMatrix:
    """Pairwise drift of the same artifact across device classes: pairs[(row, col)][output] = drift of col vs row."""

    device_classes: list[str]
    pairs: dict[tuple[str, str], dict[str, OutputDrift]]

    @property
    def outputs(self) -> list[str]:
        names: dict[str, None] = {}
        for per_output in self.pairs.values():
            names.update(dict.fromkeys(per_output))
        return list(names)

    def rows(self, metric: str, output: str) -> list[list[float]]:
        """A square table as lists (rows = the side taken as reference); NaN on the diagonal and where not
        comparable."""
        table = []
        for row in self.device_classes:
            cells = []
            for col in self.device_classes:
                drift = self.pairs.get((row, col), {}).get(output)
                value = getattr(drift, metric) if drift is not None else None
                cells.append(math.nan if value is None else float(value))
            table.append(cells)
        return table

    def matrix(self, metric: str, output: str):
        """The same table as a numpy array (numpy is imported here, on first use)."""
        import numpy as np

        n = len(self.device_classes)
        return np.array(self.rows(metric, output), dtype=float).reshape(n, n)

    def to_json(self) -> dict:
        """`pairs` is the exact content; `outputs` the same as square matrices per metric, for readers."""
        metrics = ("max_abs_error", "relative_l2", "sqnr_db", "cosine", "top1_agreement")
        return encode({"device_classes": self.device_classes,
                       "pairs": [{"row": row, "col": col, "outputs": per_output}
                                 for (row, col), per_output in self.pairs.items()],
                       "outputs": {out: {m: self.rows(m, out) for m in metrics} for out in self.outputs}})

    __json_encode__ = to_json

    @classmethod
    def from_json(cls, data: dict) -> "DriftMatrix":
        return cls(list(data["device_classes"]),
                   {(p["row"], p["col"]): decode(dict[str, OutputDrift], p["outputs"]) for p in data["pairs"]})

    __json_decode__ = from_json


@dataclass(frozen=True)
class TierLooks:
    """How an early decision (sequential evaluation) went on one device class."""

    verdict: str                  # the tier's own verdict at the look it stopped at
    look: int                     # that look (1-based)
    looks: int                    # looks planned
    samples_used: int
    samples_total: int
    stopped_early: bool           # settled before its last look
    spending: str                 # alpha spending (tiergate.stats.alpha_spent)
    confidence: float             # every interval's confidence at that look
    plan: list[Look] = field(default_factory=list)   # every look: samples, taken, confidence
    seed: int | None = None       # the seed of the looks' random partition of the samples (None: before it had one)
    stopped_by: str = ""          # the class whose final REJECT stopped this one before it was decided

    def to_json(self) -> dict:
        return encode(self)

    @classmethod
    def from_json(cls, data: dict) -> "TierLooks":
        return decode(cls, data)


@dataclass
class Decision:
    verdict: str
    checks: list[Check]
    metrics: dict[str, TargetMetrics]
    drift: dict[str, DriftMatrix]        # "candidate" and "reference" cross-tier drift
    notes: list[str]
    quantized: bool
    policy_sources: list[str]
    warnings: list[str] = field(default_factory=list)    # evidence that did not decide (e.g. agreement)
    early_stop: dict[str, TierLooks] = field(default_factory=dict)   # device class -> its looks (early stop on)

    @property
    def passed(self) -> bool:
        return self.verdict == PROMOTE

    @property
    def reasons(self) -> list[str]:
        return [check.sentence() for check in self.checks if not check.passed]

    @property
    def exit_code(self) -> int:
        """0 PROMOTE, 1 REJECT, 3 INCONCLUSIVE."""
        return VERDICT_EXIT.get(self.verdict, 1)

    def to_json(self) -> dict:
        """A JSON-ready dict (NaN and infinities as "nan"/"inf"/"-inf"); shape in docs/json-shapes.md.

        `reasons` and each check's `label` are derived, for readers; `from_json` ignores them.
        """
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "quantized": self.quantized,
            "reasons": self.reasons,
            "notes": list(self.notes),
            "checks": [c.to_json() for c in self.checks],
            "metrics": {name: m.to_json() for name, m in self.metrics.items()},
            "drift": {side: matrix.to_json() for side, matrix in self.drift.items()},
            "policy_sources": list(self.policy_sources),
            "warnings": list(self.warnings),
        } | ({"early_stop": {name: t.to_json() for name, t in self.early_stop.items()}} if self.early_stop else {})

    @classmethod
    def from_json(cls, data: dict) -> "Decision":
        """The Decision that `to_json` wrote (exact: NaN, infinities and every typed field come back)."""
        if data.get("schema") != SCHEMA:
            raise InputError(f"decision JSON has schema {data.get('schema')!r}; this tiergate reads {SCHEMA}")
        return cls(data["verdict"], [Check.from_json(c) for c in data["checks"]],
                   {name: TargetMetrics.from_json(m) for name, m in data["metrics"].items()},
                   {side: DriftMatrix.from_json(d) for side, d in data["drift"].items()},
                   list(data["notes"]), bool(data["quantized"]), list(data["policy_sources"]),
                   list(data.get("warnings", [])),
                   {name: TierLooks.from_json(t) for name, t in data.get("early_stop", {}).items()})

    def dumps(self) -> str:
        """Canonical JSON text: two decisions are equal when these are."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True, allow_nan=False)

    def __eq__(self, other) -> bool:
        return isinstance(other, Decision) and self.dumps() == other.dumps()

    __hash__ = None

@dataclass
class GateRun:
    """What one gate produced: the decision and where its evidence lies. The normal path fills every field;
    the decision cache's fast answer (tiergate.quickgate) fills the decision, the run folders and the runtime
    graphs as they were saved, and the artifacts' content hashes it verified (its `intakes` and `outcomes` stay
    empty: nothing was loaded)."""

    decision: Decision
    run_dirs: dict = field(default_factory=dict)                  # (role, device class) -> run folder
    intakes: dict = field(default_factory=dict)                   # role -> orchestrator.Intake
    outcomes: dict = field(default_factory=dict)                  # role -> device class -> gate.RunOutcome
    cache_hits: int = 0
    containers_started: int = 0
    decision_cached: bool = False
    decision_key: str = ""
    runtime: dict[str, dict] = field(default_factory=dict)       # device class -> candidate's runtime graph
    runtime_findings: dict[str, list] = field(default_factory=dict)   # device class -> lint on it
    report_files: dict = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)         # role -> content hash (the fast path's answer)
    # the data decided on ("archive", its sha256) and the files it was read from ("data", "labels_file": evaldata's
    # origin): what the fast path remembers the request by
    data_origin: dict = field(default_factory=dict)

    def artifact_hashes(self) -> dict[str, str]:
        """role -> the artifact's content hash as intake computes it (ONNX external data included): the intakes'
        on the normal path, what the fast path verified on an unchanged re-run."""
        return {role: item.sha256 for role, item in self.intakes.items()} or dict(self.hashes)

    def runtime_summary(self) -> dict[str, dict]:
        """Per device class, what its runtime executes of the candidate: ops at the tier's own level."""
        return runtime_summary(self.runtime)


def runtime_summary(runtime: dict[str, dict]) -> dict[str, dict]:
    """Per device class, what its runtime executes of the candidate: ops at the tier's own level, and the CPU
    it saw."""
    summary = {}
    for name, graph in runtime.items():
        level = graph.get("default_level") or ""
        ops = graph.get("ops", {})
        summary[name] = {"ok": graph.get("ok", False), "error": graph.get("error", ""), "level": level,
                         "ops": ops.get(level, {}) if level else ops, "placement": graph.get("placement", {}),
                         "cpu": graph.get("cpu", {})}
        if graph.get("passes"):
            summary[name]["passes"] = pass_summary(graph["passes"])
        if graph.get("npu"):
            summary[name]["npu"] = npu_summary(graph)
    return summary


def npu_summary(graph: dict) -> dict:
    """An NPU tier's placement and estimate kept small for the record (tiergate.npu.placement; docs/npu.md)."""
    from tiergate.npu.placement import Placement

    placement = Placement.from_record(graph.get("npu"))
    return {"tier": graph.get("tier", ""), **placement.to_json()} if placement is not None else {}


def changed_passes(passes: list[dict]) -> list[dict]:
    """A compile's passes ({"name", "fingerprint"} in order) after which the module's fingerprint changed (the
    first pass always), in order: the record's summary here, bisect's search and inspect's table
    (runtime_graph re-exports it)."""
    out, last = [], None
    for p in passes:
        if p["fingerprint"] != last:
            out.append(p)
        last = p["fingerprint"]
    return out


def pass_summary(passes: list[dict]) -> dict:
    """A compiled tier's passes kept small for the record: how many were applied, a digest of the whole list, the
    module's final fingerprint, and the passes that changed the module as [name, fingerprint] in order."""
    import hashlib

    changed = [[p["name"], p["fingerprint"]] for p in changed_passes(passes)]
    digest = hashlib.sha256("\n".join(f"{p['name']} {p['fingerprint']}" for p in passes).encode()).hexdigest()
    return {"count": len(passes), "sha256": digest, "final": passes[-1]["fingerprint"], "changed": changed}


def cpu_text(cpu: dict, limit: int = 8) -> str:
    """'Intel Core Processor (Haswell): avx2 fma ...' : a CPU as a runtime saw it, its decisive features first."""
    if not cpu:
        return ""
    features = list(cpu.get("features", []))
    first = [f for f in DECISIVE_FEATURES if f in features]
    rest = [f for f in features if f not in first]
    shown = (first + rest)[:limit]
    more = f" +{len(features) - len(shown)}" if len(features) > len(shown) else ""
    return f"{cpu.get('model', '?')}: {' '.join(shown)}{more}"


# the features that decide which kernels a runtime picks (MLAS, XNNPACK): shown first
DECISIVE_FEATURES = ("avx512_vnni", "avx_vnni", "avx512f", "avx512bw", "avx2", "fma", "avx", "sse4_1", "sve2", "sve",
                     "i8mm", "asimddp", "asimdhp", "asimd")


def _fmt(value) -> str:
    return number(value, 6, missing="None")
