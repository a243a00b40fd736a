"""The pure part of `tiergate explain --fix`: which layers to return to float, in which order, how few of them
pass, and the table of the candidates that fix it, smallest first.

The candidates themselves are made and gated in tiergate.orchestrator.explain_fix (onnxruntime's quantizer, then
the one gate path); this module holds what needs no runtime: the ranked layers (per tier from the explanation,
merged by rank across tiers), the nodes of a layer in the candidate's own graph (one Q/DQ pair: the node that
writes the quantized tensor and every node that reads it), the search for the shortest passing prefix of the
ranked list (doubling, then bisection: at most 2*ceil(log2 n) + 1 gates for n layers), a gate's verdict per
tier with its interval, and the fixes table as JSON, text rows and Markdown.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tiergate.codec import decode, encode

_QDQ = ("QuantizeLinear", "DequantizeLinear")

# what a candidate is (Fix.method)
CANDIDATE, RECALIBRATED, FLOAT_SET, BOTH = "candidate", "recalibrated", "float set", "recalibrated + float set"
PASS, FAIL, INCONCLUSIVE, NOT_GATED = "pass", "fail", "inconclusive", "not gated"


# --- which layers, in which order -----------------------------------------------------------------


def merge_ranked(lists: list[list]) -> list:
    """Each tier's suspect layers (tiergate.explain.worst_layers, worst first) merged by rank: every tier's
    worst, then every tier's second worst, ... (each FP32 tensor once, at its best rank)."""
    merged, seen = [], set()
    for rank in range(max((len(x) for x in lists), default=0)):
        for ranked in lists:
            if rank < len(ranked) and ranked[rank].tensor not in seen:
                seen.add(ranked[rank].tensor)
                merged.append(ranked[rank])
    return merged


def layer_nodes(graph, layer) -> list[str]:
    """The candidate's nodes that compute with this layer's quantization (an ONNX graph): the node that writes
    the quantized tensor and every node that reads it through its DequantizeLinear (or directly: a QLinear op),
    so that all of them in float removes that Q/DQ pair; and the explanation's own `nodes` of the layer.
    Found from the tensor the explanation dumped (`candidate_tensor`) or the FP32 tensor's name."""
    made_by = {out: n for n in graph.node for out in n.output}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    quantize = None
    for name in dict.fromkeys(x for x in (layer.candidate_tensor, layer.tensor) if x):
        node = made_by.get(name)
        if node is not None and node.op_type == "QuantizeLinear":
            quantize = node
        else:
            quantize = next((r for r in readers.get(name, []) if r.op_type == "QuantizeLinear"), None)
        if quantize is not None:
            break
    if quantize is not None:
        found = [made_by.get(quantize.input[0])]
        for reader in readers.get(quantize.output[0], []):
            found += readers.get(reader.output[0], []) if reader.op_type == "DequantizeLinear" else [reader]
    else:
        name = layer.candidate_tensor or layer.tensor
        found = [made_by.get(name)] + readers.get(name, [])
    names = list(layer.nodes) + [n.name for n in found if n is not None and n.name and n.op_type not in _QDQ]
    return list(dict.fromkeys(names))


@dataclass
class FloatLayer:
    """One step of the float set: a layer (its FP32 tensor) and the nodes returned to float with it."""

    tensor: str
    nodes: list[str]


def float_steps(layers: list, nodes_of: Callable[[object], list[str]]) -> tuple[list[FloatLayer], list[str]]:
    """The ranked layers as steps that each add nodes: a layer with no node to return to float, or whose nodes
    an earlier step already holds, is left out (a gate on it would change nothing). Returns (steps, left out)."""
    steps, held, left = [], set(), []
    for layer in layers:
        nodes = [n for n in nodes_of(layer) if n not in held]
        if not nodes:
            left.append(layer.tensor)
            continue
        held.update(nodes)
        steps.append(FloatLayer(layer.tensor, nodes))
    return steps, left


def nodes_of(steps: list[FloatLayer]) -> list[str]:
    return [n for step in steps for n in step.nodes]


# --- how few of them pass -------------------------------------------------------------------------


@dataclass
class Search:
    """The shortest passing prefix: its length (None: not even the whole list passes) and every length tried,
    in order, with its outcome."""

    n: int
    found: int | None
    tried: list[tuple[int, bool]] = field(default_factory=list)

    @property
    def gates(self) -> int:
        return len(self.tried)


def max_gates(n: int) -> int:
    """The most gates shortest_passing_prefix runs on n layers: 2 * ceil(log2 n) + 1."""
    return 2 * math.ceil(math.log2(n)) + 1 if n > 1 else n


def shortest_passing_prefix(n: int, passes: Callable[[int], bool]) -> Search:
    """The smallest k in 1..n for which passes(k) (the first k layers in float pass the gate on every tier),
    taking passes as monotone in k and the empty prefix (the candidate itself) as failing. Doubling (1, 2, 4, ...,
    n) until one passes, then bisection between the last failing length and it: at most 2*ceil(log2 n) + 1 calls,
    none repeated; one call when the worst layer alone is enough."""
    search = Search(n, None)

    def test(k: int) -> bool:
        for done, passed in search.tried:
            if done == k:
                return passed
        passed = bool(passes(k))
        search.tried.append((k, passed))
        return passed

    if n <= 0:
        return search
    failing, k = 0, 1
    while not test(k):
        failing = k
        if k == n:
            return search
        k = min(2 * k, n)
    passing = k
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if test(middle):
            passing = middle
        else:
            failing = middle
    search.found = passing
    return search


# --- a gate's verdict per tier, and the table ------------------------------------------------------


@dataclass
class TierVerdict:
    """One tier's verdict on one candidate against the FP32 reference (the A/B checks aside), with the interval
    of its first check that has one (the accuracy check's CI)."""

    verdict: str                         # pass, fail, inconclusive, not gated
    check: str = ""                      # the check whose interval is shown (accuracy_ratio, ...)
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    confidence: float | None = None
    threshold: float | None = None
    latency_ms: float | None = None      # mean per call; non-emulated tiers only
    emulated: bool = False
    vs_int8: list[float] | None = None   # its time / the INT8 candidate's: [median, low, high] of interleaved pairs
    reasons: list[str] = field(default_factory=list)

    def text(self) -> str:
        """'pass accuracy_ratio 0.998 [0.985, 1]' ; 'not gated'."""
        if self.estimate is None or self.low is None:
            return self.verdict
        return f"{self.verdict} {self.check} {_num(self.estimate)} [{_num(self.low)}, {_num(self.high)}]".replace(
            "  ", " ")


def tier_verdicts(decision, device_classes: list[str]) -> dict[str, TierVerdict]:
    """Per device class: pass when every check of that tier (and every check about all tiers, the signature)
    passed, the A/B checks against the incumbent aside; inconclusive when none failed but some straddle their
    threshold; the interval of its first check that has one."""
    checks = [c for c in decision.checks if not c.name.startswith("noninferior")]
    shared = [c for c in checks if c.device_class == "*"]
    verdicts = {}
    for name in device_classes:
        own = [c for c in checks if c.device_class == name] + shared
        if not own:
            continue
        failed = [c for c in own if not c.passed]
        verdict = PASS if not failed else (INCONCLUSIVE if all(c.inconclusive for c in failed) else FAIL)
        item = TierVerdict(verdict, reasons=[c.sentence() for c in failed])
        interval = _shown(own, decision.metrics.get(name))
        if interval is not None:
            item.check, item.threshold = interval.label, _float(interval.threshold)
            item.estimate, item.low = interval.interval.estimate, interval.interval.low
            item.high, item.confidence = interval.interval.high, interval.interval.confidence
        timed = next((c for c in decision.checks if c.device_class == name and c.name == "noninferior_latency"
                      and c.interval is not None), None)
        if timed is not None:        # against the incumbent (the INT8 candidate), in one process, call by call
            item.vs_int8 = [timed.interval.estimate, timed.interval.low, timed.interval.high]
        metrics = decision.metrics.get(name)
        if metrics is not None:
            item.emulated = bool(metrics.emulated)
            latency = metrics.latency.get("candidate")
            if latency is not None and not item.emulated:
                item.latency_ms = float(latency.mean_ms)
        verdicts[name] = item
    return verdicts


def _shown(checks: list, metrics) -> object | None:
    """The check whose interval a tier's cell shows: the task's (accuracy, a --metric or [metrics.NAME], an output
    kind's: what the model is for), the first that does not pass before those that do; else any with an interval."""
    names = ["accuracy", *(getattr(metrics, "task", None) or {})]
    with_interval = [c for c in checks if c.interval is not None]
    task = [c for c in with_interval if any(c.name == n or c.name.startswith(f"{n}_") for n in names)]
    for group in ([c for c in task if not c.passed], task, with_interval):
        if group:
            return group[0]
    return None


def _float(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass
class Fix:
    """One candidate gated against the FP32 reference on the request's tiers (the INT8 candidate as incumbent)."""

    name: str                            # recal-entropy, float-set, recal-entropy+float-set; int8 for the candidate
    method: str                          # CANDIDATE, RECALIBRATED, FLOAT_SET or BOTH
    path: str
    calibration: str                     # "entropy", "percentile 99.99", "the candidate's own ranges", ...
    passes: bool                         # every tier passes against the FP32 reference
    verdict: str                         # the gate's own verdict (the A/B against the INT8 candidate included)
    tiers: dict[str, TierVerdict] = field(default_factory=dict)
    size_bytes: int = 0
    float_layers: list[FloatLayer] = field(default_factory=list)
    gates: int = 1                       # gates run to make and judge it (a search: every length tried)
    trail: list[dict] = field(default_factory=list)   # a search's lengths tried: {"layers": k, "passed": ...}
    ab: dict[str, dict] = field(default_factory=dict)  # "<class>/<check>": {"value", "threshold", "passed"}
    reasons: list[str] = field(default_factory=list)
    note: str = ""
    same_as: list[str] = field(default_factory=list)   # other methods that made these very bytes (not gated again)

    @property
    def float_nodes(self) -> list[str]:
        return nodes_of(self.float_layers)

    def latency_ms(self) -> dict[str, float]:
        return {name: t.latency_ms for name, t in self.tiers.items() if t.latency_ms is not None}


def order_fixes(fixes: list[Fix]) -> list[Fix]:
    """Smallest first: those that pass before those that do not, then fewer layers kept in float, then fewer bytes
    (a stable sort: equal ones keep the order they were made in)."""
    return sorted(fixes, key=lambda f: (not f.passes, len(f.float_layers), f.size_bytes))


@dataclass
class FixReport:
    """`explain --fix`'s answer, under "fixes" in the explanation JSON (docs/json-shapes.md)."""

    calibration_data: str
    settings: dict
    candidate: Fix                       # the INT8 candidate as given, gated the same way
    fixes: list[Fix] = field(default_factory=list)       # smallest first (order_fixes)
    ranked_layers: list[str] = field(default_factory=list)   # the float set's order: FP32 tensors, worst first
    left_out: list[str] = field(default_factory=list)    # ranked layers with no node of their own to return
    gates_run: int = 0                   # gates run in all (orchestrator.gate calls; a tier stage is one)
    notes: list[str] = field(default_factory=list)

    @property
    def passing(self) -> list[Fix]:
        return [f for f in self.fixes if f.passes]

    def to_json(self) -> dict:
        doc = encode(self)
        doc["passing"] = [f.name for f in self.passing]
        for item in [doc["candidate"], *doc["fixes"]]:
            item["float_nodes"] = nodes_of([FloatLayer(**x) for x in item["float_layers"]])
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "FixReport":
        return decode(cls, doc)


def tier_names(report: FixReport) -> list[str]:
    names = list(report.candidate.tiers)
    for fix in report.fixes:
        names += [n for n in fix.tiers if n not in names]
    return names


def rows(report: FixReport) -> tuple[list[str], list[list[str]]]:
    """The fixes table (the INT8 candidate first, then the fixes smallest first) as plain text cells: one
    header, one row per candidate; a tier's cell is its verdict, interval and (real tiers) mean latency per call.
    Shared by the CLI, Markdown and the HTML page."""
    tiers = tier_names(report)
    header = ["candidate", "method", "passes", *tiers, "size", "layers in float", "gates"]
    table = []
    for fix in [report.candidate, *report.fixes]:
        layers = (f"{len(fix.float_layers)}: " + ", ".join(
            f"{layer.tensor} ({', '.join(layer.nodes)})" for layer in fix.float_layers)) if fix.float_layers else "0"
        name = fix.name + "".join(f" = {other}" for other in fix.same_as)
        table.append([name, f"{fix.method} ({fix.calibration})", "yes" if fix.passes else "no",
                      *[_cell(fix.tiers.get(t)) for t in tiers], f"{fix.size_bytes:,} B", layers, str(fix.gates)])
    return header, table


def notes(report: FixReport) -> list[str]:
    """What the table says below it: each candidate's own note, then the report's."""
    said = [f"{fix.name}: {fix.note}" for fix in [report.candidate, *report.fixes] if fix.note]
    said += [f"{', '.join(fix.same_as)}: the same model as {fix.name}, byte for byte (gated once)"
             for fix in report.fixes if fix.same_as]
    return said + list(report.notes)


def _cell(verdict: TierVerdict | None) -> str:
    if verdict is None:
        return NOT_GATED
    latency = "" if verdict.latency_ms is None else f", {verdict.latency_ms:.3f} ms"
    if verdict.vs_int8:
        ratio, low, high = verdict.vs_int8
        latency += f" ({_num(ratio)}x the INT8's time [{_num(low)}, {_num(high)}])"
    return verdict.text() + latency


def markdown_fixes(doc: dict) -> str:
    """The fixes table as Markdown (explain.md), from the JSON under "fixes"."""
    report = FixReport.from_json(doc)
    header, table = rows(report)
    lines = ["## Candidates that fix it, smallest first", "",
             f"calibration data `{report.calibration_data}`; every candidate gated against the FP32 reference "
             f"with the INT8 candidate as incumbent; {report.gates_run} gates run", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table]
    lines += [""] + [f"- {note}" for note in notes(report)]
    return "\n".join(lines) + "\n"


def _num(value) -> str:
    return "—" if value is None else f"{float(value):.4g}"
