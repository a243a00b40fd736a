"""Which layer lost it: pair a candidate's intermediate tensors with its FP32 reference's, per tier.

This module is the pure part of `tiergate explain` (no Docker): it prepares the models whose
intermediate tensors a tier's runtime will dump (tiergate.execution.explain runs them inside
each tier's container with containers/harness/tiergate_explain.py), pairs the dumped tensors,
computes per paired FP32 tensor SQNR (dB), cosine, max abs error and the share of values
saturated at the quantization range's ends, finds the first divergent tensor, and suggests
what to keep in float and which calibration range to look at.

ONNX pairing (QDQ or float candidates). The reference exposes every node output
(onnxruntime.quantization.qdq_loss_debug.modify_model_output_intermediate_tensors). The
candidate exposes only what keeps its integer kernels fused: for every compute node whose name
the reference shares, the value it consumes at each activation input is either a
DequantizeLinear of an integer tensor (the QuantizeLinear output is exposed and dequantized
here with that DequantizeLinear's scale and zero point: the exact value the node reads) or a
float tensor (exposed as is). It is paired with the reference node's input at the same
position: the FP32 tensor of that layer. Exposing DequantizeLinear outputs instead would stop
onnxruntime from fusing DQ -> op -> Q into one integer kernel, and a tier's integer-kernel
saturation would vanish from the evidence. Graph outputs pair by name. Tensors computed
inside subgraphs (If/Loop/Scan bodies) cannot be graph outputs: they are listed as skipped.

TFLite pairing (tflite_pairing.py, read from both flatbuffers before any tier runs): the same name
first, then structure: both graphs walked from their inputs, through the QUANTIZE / DEQUANTIZE ops
the converter inserts, fused activations and dequantized weights; each candidate tensor left
unpaired says why (Plan.unpaired_reasons). The interpreter runs with
experimental_preserve_all_tensors; no tensor in common is an InputError.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tiergate.errors import InputError

DEFAULT_THRESHOLD_DB = 20.0
SQNR_CAP_DB = 200.0
MIN_DROP_DB = 1.0            # a layer that loses less than this relative to the one before adds no noise of its own          # identical tensors: reported as this, JSON has no infinity
_QDQ = ("QuantizeLinear", "DequantizeLinear")


# --- the plan: which tensor of the candidate pairs with which FP32 tensor ---------------------


@dataclass
class Source:
    """One candidate tensor paired with one FP32 reference tensor."""

    fp32: str                    # the reference tensor (the layer's name in the report)
    tensor: str                  # the candidate tensor dumped
    op: str                      # the reference op that produced the FP32 tensor ("input" for inputs)
    order: int                   # topological position of that op in the reference
    scale: float | None = None   # integer tensors: dequantized with these
    zero_point: int = 0
    dtype: str = ""
    # keep-float candidates: the nodes around the tensor (its producer, its consumers) that the candidate
    # quantized (ONNX: named alike in both models; TFLite: the tensor itself when the candidate quantizes it)
    nodes: list[str] = field(default_factory=list)
    location: list[str] = field(default_factory=list)   # TFLite: where the candidate's op came from (debug metadata)
    candidate_op: str = ""       # TFLite: the candidate op that writes `tensor` ("input" for inputs)


@dataclass
class Plan:
    """What to dump on each tier and how to pair it."""

    format: str
    candidate: Path
    reference: Path
    sources: list[Source] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)     # tensors inside subgraphs: not exposable
    unpaired: list[str] = field(default_factory=list)    # candidate tensors with no FP32 counterpart
    outputs: list[str] = field(default_factory=list)     # the reference's graph outputs (end to end)
    quantized: list[str] = field(default_factory=list)   # the candidate's nodes that compute on integers
    unpaired_reasons: dict[str, str] = field(default_factory=dict)   # unpaired candidate tensor -> why


def plan(candidate: Path, reference: Path, work: Path) -> Plan:
    """Prepare the models to dump (written under `work`) and the pairing, by format."""
    from tiergate.artifact.detect import detect_format, read_model_file

    fmt = detect_format(Path(candidate), read_model_file(Path(candidate)))
    if fmt != detect_format(Path(reference), read_model_file(Path(reference))):
        raise InputError(f"{candidate} and {reference}: the candidate and the reference are in different formats")
    work.mkdir(parents=True, exist_ok=True)
    if fmt == "tflite":
        from tiergate.explain.tflite_pairing import pair

        found = pair(Path(candidate), Path(reference))
        return Plan("tflite", Path(candidate), Path(reference), [Source(**item) for item in found.sources],
                    unpaired=sorted(found.unpaired), outputs=found.outputs, unpaired_reasons=dict(found.unpaired))
    return plan_onnx(Path(candidate), Path(reference), work)


def plan_onnx(candidate: Path, reference: Path, work: Path) -> Plan:
    import onnx
    from onnx import numpy_helper

    cand = onnx.load(str(candidate))
    ref = onnx.load(str(reference))
    rg, cg = ref.graph, cand.graph
    r_init = {t.name for t in rg.initializer}
    c_init = {t.name: t for t in cg.initializer}
    r_inputs = [i.name for i in rg.input if i.name not in r_init]
    producer = {out: (k, n) for k, n in enumerate(rg.node) for out in n.output}
    consumers: dict[str, list[str]] = {}
    for n in rg.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n.name)
    ref_by_name = {n.name: n for n in rg.node if n.name}
    c_producer = {out: n for n in cg.node for out in n.output}

    quantized = quantized_nodes(cg)

    def where(fp32: str) -> tuple[str, int, list[str]]:
        k, node = producer.get(fp32, (-1, None))
        around = ([node.name] if node is not None and node.name else []) + consumers.get(fp32, [])
        return (node.op_type if node is not None else "input"), k, [n for n in dict.fromkeys(around) if n in quantized]

    def const(name: str):
        return numpy_helper.to_array(c_init[name]) if name in c_init else None

    sources: dict[tuple[str, str], Source] = {}
    unpaired: list[str] = []
    for node in cg.node:
        if node.op_type in _QDQ or not node.name:
            continue
        twin = ref_by_name.get(node.name)
        if twin is None:
            continue
        for k, (c_in, r_in) in enumerate(zip(node.input, twin.input)):
            if not c_in or not r_in or r_in in r_init or c_in in c_init:
                continue
            src = c_producer.get(c_in)
            op, order, around = where(r_in)
            if src is not None and src.op_type == "DequantizeLinear":
                q_in = src.input[0]
                if q_in in c_init:                  # a weight
                    continue
                scale = const(src.input[1])
                zp = const(src.input[2]) if len(src.input) > 2 and src.input[2] else np.zeros((), np.uint8)
                if scale is None or scale.size != 1:
                    unpaired.append(c_in)
                    continue
                item = Source(r_in, q_in, op, order, float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]),
                              zp.dtype.name, around)
            else:
                item = Source(r_in, c_in, op, order, nodes=around)
            sources.setdefault((item.fp32, item.tensor), item)
    c_outputs = {o.name for o in cg.output}
    r_outputs = [o.name for o in rg.output]
    for name in r_outputs:
        if name in c_outputs:
            op, order, around = where(name)
            sources.setdefault((name, name), Source(name, name, op, order, nodes=around))
    if not sources:
        raise InputError(f"{candidate} and {reference}: no tensor in common (no node of the candidate is "
                         "named like one of the reference, and no graph output matches): nothing to pair")
    skipped = sorted(set(_subgraph_outputs(rg)) | set(_subgraph_outputs(cg)))
    exposable = {out for n in rg.node for out in n.output} | set(r_inputs)
    kept = [s for s in sources.values() if s.fp32 in exposable or s.fp32 in r_inputs]
    # the models to dump: the reference with every node output, the candidate with its chosen tensors
    ref_path, cand_path = work / "reference-dump.onnx", work / "candidate-dump.onnx"
    _expose_all(reference, ref_path)
    wanted = [s.tensor for s in kept if s.tensor not in {i.name for i in cg.input}]
    _expose(cand, wanted, cand_path)
    return Plan("onnx", cand_path, ref_path, sorted(kept, key=lambda s: (s.order, s.fp32)), skipped,
                sorted(set(unpaired)), r_outputs, sorted(quantized))


_INTEGER_OPS = ("ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulNBits")


def quantized_nodes(graph) -> set[str]:
    """Names of the candidate's compute nodes that run on integers: an integer op (QLinear*, ConvInteger, ...),
    or a node all of whose non-constant inputs are dequantized and that either reads a quantized weight (a
    DequantizeLinear of a constant) or has its output quantized again (DQ -> op -> Q, what runtimes fuse).
    A float node that merely reads a dequantized tensor is not one: keeping it in float changes nothing."""
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant"
                                                       for o in n.output}
    made_by = {out: n for n in graph.node for out in n.output}
    quantizes = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear" and n.input}
    found = set()
    for node in graph.node:
        if not node.name or node.op_type in _QDQ:
            continue
        if node.op_type.startswith("QLinear") or node.op_type in _INTEGER_OPS:
            found.add(node.name)
            continue
        sources = [made_by.get(name) for name in node.input if name and name not in constants]
        if not sources or not all(src is not None and src.op_type == "DequantizeLinear" for src in sources):
            continue
        weights = any(src is not None and src.op_type == "DequantizeLinear" and src.input[0] in constants
                      for src in (made_by.get(name) for name in node.input if name))
        if weights or any(out in quantizes for out in node.output):
            found.add(node.name)
    return found


def _subgraph_outputs(graph) -> list[str]:
    """Every value computed inside a subgraph of `graph` (not exposable as a graph output)."""
    from onnx import AttributeProto

    found = []
    for node in graph.node:
        for attr in node.attribute:
            bodies = ([attr.g] if attr.type == AttributeProto.GRAPH else
                      list(attr.graphs) if attr.type == AttributeProto.GRAPHS else [])
            for body in bodies:
                found += [out for n in body.node for out in n.output if out]
                found += _subgraph_outputs(body)
    return found


def _expose_all(path: Path, out: Path) -> None:
    """The reference with every node output as a graph output (onnxruntime's own helper)."""
    from onnxruntime.quantization.qdq_loss_debug import modify_model_output_intermediate_tensors

    modify_model_output_intermediate_tensors(str(path), str(out))


def _expose(model, names: list[str], out: Path) -> None:
    import onnx
    from onnx import helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    for name in dict.fromkeys(names):
        if name not in have:
            copy.graph.output.append(helper.ValueInfoProto(name=name))
    onnx.save(copy, str(out))


# --- the figures ------------------------------------------------------------------------


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """20*log10(|ref| / |ref - out|), as onnxruntime's qdq_loss_debug; identical -> SQNR_CAP_DB."""
    ref = ref.astype(np.float64).ravel()
    noise = np.linalg.norm(ref - out.astype(np.float64).ravel())
    signal = np.linalg.norm(ref)
    if noise == 0:
        return SQNR_CAP_DB
    if signal == 0:
        return -SQNR_CAP_DB
    return float(max(-SQNR_CAP_DB, min(SQNR_CAP_DB, 20 * math.log10(signal / noise))))


def cosine(ref: np.ndarray, out: np.ndarray) -> float:
    """Mean per-sample cosine similarity (first axis = sample)."""
    a = ref.reshape(len(ref), -1).astype(np.float64)
    b = out.reshape(len(out), -1).astype(np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    both_zero = (na == 0) & (nb == 0)
    cos = np.where(both_zero, 1.0, (a * b).sum(axis=1) / np.maximum(na * nb, 1e-30))
    return float(np.mean(cos))


def qrange(scale: float, zero_point: int, dtype: str) -> tuple[float, float]:
    info = np.iinfo(np.dtype(dtype))
    return (info.min - zero_point) * scale, (info.max - zero_point) * scale


@dataclass
class Layer:
    tensor: str
    op: str
    sqnr_db: float
    cosine: float
    max_abs_error: float
    saturation: float | None            # share of FP32 values beyond the quantization range (clipped)
    range: list[float] | None = None    # the candidate's quantization range of the tensor
    observed: list[float] = field(default_factory=list)   # min, max of the FP32 tensor
    candidate_tensor: str = ""
    nodes: list[str] = field(default_factory=list)
    location: list[str] = field(default_factory=list)    # TFLite: the candidate op's location, where the file keeps it

    def to_json(self) -> dict:
        return {k: (_round(v) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def measure(source: Source, cand: np.ndarray, ref: np.ndarray) -> Layer:
    """The figures of one pair (arrays with the sample axis first)."""
    if cand.shape != ref.shape:
        if cand.size != ref.size:
            raise ValueError(f"shapes differ: {cand.shape} vs {ref.shape}")
        cand = cand.reshape(ref.shape)
    ref = ref.astype(np.float32)
    saturation, rng = None, None
    if source.scale is not None:
        lo, hi = qrange(source.scale, source.zero_point, source.dtype)
        rng = [_round(lo), _round(hi)]
        cand = ((cand.astype(np.float32) - source.zero_point) * source.scale).astype(np.float32)
        # clipped = more than one quantization step beyond the representable end: a softmax's 1.0 against
        # an int8 top of 255/256 is rounding, not saturation (no false "range too narrow" hint)
        step = 1.01 * source.scale
        saturation = float(np.mean((ref < lo - step) | (ref > hi + step))) if ref.size else 0.0
    cand = cand.astype(np.float32)
    observed = [_round(float(ref.min())), _round(float(ref.max()))] if ref.size else []
    return Layer(source.fp32, source.op, sqnr_db(ref, cand), cosine(ref, cand),
                 float(np.max(np.abs(ref - cand))) if ref.size else 0.0, saturation, rng, observed,
                 source.tensor, source.nodes, list(source.location))


# --- one tier's answer ------------------------------------------------------------------


@dataclass
class TierExplain:
    target: str
    threshold_db: float
    layers: list[Layer] = field(default_factory=list)
    first_divergent: str | None = None
    end_to_end_sqnr_db: float | None = None
    unpaired: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    keep_float: list[str] = field(default_factory=list)      # nodes (ONNX) or tensors (TFLite)
    calibration: list[str] = field(default_factory=list)
    seconds: float = 0.0
    machine: str = ""
    error: str = ""
    unpaired_reasons: dict[str, str] = field(default_factory=dict)     # unpaired tensor -> why (where known)

    def to_json(self) -> dict:
        return {"first_divergent": self.first_divergent, "threshold_db": self.threshold_db,
                "end_to_end_sqnr_db": None if self.end_to_end_sqnr_db is None else _round(self.end_to_end_sqnr_db),
                "layers": [layer.to_json() for layer in self.layers],
                "suggestions": {"keep_float": self.keep_float, "calibration": self.calibration},
                "unpaired": self.unpaired, "skipped": self.skipped, "seconds": round(self.seconds, 3),
                "machine": self.machine, "error": self.error, "unpaired_reasons": self.unpaired_reasons}

    def worst(self, n: int = 5) -> list[Layer]:
        return sorted(self.layers, key=lambda layer: layer.sqnr_db)[:n]


def analyse(plan_: Plan, target: str, dumps: dict[str, dict[str, np.ndarray]], *, threshold_db: float,
            meta: dict | None = None) -> TierExplain:
    """Pair one tier's dumps ({"candidate": {tensor: array}, "reference": {...}}) and judge them."""
    meta = meta or {}
    cand, ref = dumps.get("candidate", {}), dumps.get("reference", {})
    sources, reasons = list(plan_.sources), dict(plan_.unpaired_reasons)
    if plan_.format == "tflite":
        from tiergate.explain.tflite_pairing import runtime_checked

        sources, more = runtime_checked(sources, meta)
        reasons.update(more)
    result = TierExplain(target, threshold_db, skipped=list(plan_.skipped),
                         unpaired=list(plan_.unpaired) + list(reasons), machine=meta.get("machine", ""), seconds=float(meta.get("seconds", 0.0)))
    inputs = meta.get("inputs", {})
    best: dict[str, Layer] = {}
    for source in sources:
        c = cand.get(source.tensor, inputs.get(source.tensor))
        r = ref.get(source.fp32, inputs.get(source.fp32))
        if c is None or r is None:
            result.unpaired.append(source.tensor)
            reasons.setdefault(source.tensor, "the tier's runtime kept no values of it" if c is None else
                               f"the tier's runtime kept no values of its FP32 tensor {source.fp32}")
            continue
        try:
            layer = measure(source, c, r)
        except ValueError as exc:
            result.unpaired.append(source.tensor)
            reasons.setdefault(source.tensor, f"not comparable with {source.fp32}: {exc}")
            continue
        if source.fp32 not in best or layer.sqnr_db < best[source.fp32].sqnr_db:
            best[source.fp32] = layer
    order = {s.fp32: (s.order, i) for i, s in enumerate(sources)}
    result.layers = sorted(best.values(), key=lambda layer: order[layer.tensor])
    if not result.layers:
        raise InputError(f"{target}: the candidate and the reference have no tensor in common: nothing to pair"
                         + (f" ({len(result.unpaired)} candidate tensors have no FP32 counterpart)"
                            if result.unpaired else ""))
    result.unpaired = sorted(set(result.unpaired))
    result.unpaired_reasons = {name: reasons[name] for name in result.unpaired if name in reasons}
    result.first_divergent = next((layer.tensor for layer in result.layers if layer.sqnr_db < threshold_db), None)
    outputs = [best[name] for name in plan_.outputs if name in best]
    if outputs:
        result.end_to_end_sqnr_db = min(layer.sqnr_db for layer in outputs)
    result.keep_float = keep_float(result.layers, threshold_db, set(plan_.outputs))
    result.calibration = calibration_hints(result.layers)
    return result


def keep_float(layers: list[Layer], threshold_db: float, outputs: set[str], limit: int = 3) -> list[str]:
    """The nodes to keep in float, worst first: the nodes the candidate quantized around the `limit` worst
    layers that have any (worst_layers' ranking; an estimate: --mixed-precision verifies it end to end)."""
    nodes: list[str] = []
    for layer in [x for x in worst_layers(layers, threshold_db, outputs) if x.nodes][:limit]:
        nodes += [n for n in layer.nodes if n not in nodes]
    return nodes


CLIPPED = 0.02               # a layer's input with more of its values clipped than this is a suspect by itself
CLIP_DB = 100.0              # ranking: a share s of clipped values weighs like 100 * s dB of SQNR lost


def worst_layers(layers: list[Layer], threshold_db: float, outputs: set[str]) -> list[Layer]:
    """Suspect layers, worst first: those below the threshold that lose at least MIN_DROP_DB relative to the
    layer before, and those whose input is clipped (more than CLIPPED of the FP32 values beyond the candidate's
    quantization range, however high its SQNR). Ranked by loss = max(SQNR drop, CLIP_DB x clipped share)."""
    ranked, previous = [], SQNR_CAP_DB
    for layer in layers:
        drop, previous = previous - layer.sqnr_db, layer.sqnr_db
        clipped = layer.saturation or 0.0
        diverges = layer.sqnr_db < threshold_db and drop >= MIN_DROP_DB
        if layer.tensor not in outputs and (diverges or clipped > CLIPPED):
            ranked.append((max(drop if diverges else 0.0, CLIP_DB * clipped), layer))
    return [layer for _, layer in sorted(ranked, key=lambda item: -item[0])]


def calibration_hints(layers: list[Layer], *, wide: float = 4.0, narrow: float = 0.02) -> list[str]:
    """A range far wider than the observed values (coarse steps), one that clips them, one that admits
    negative values a non-negative tensor never has (an absorbed Relu lost), or the default [-6, 6]."""
    hints = []
    for layer in layers:
        if layer.range is None or not layer.observed:
            continue
        lo, hi = layer.range
        omin, omax = layer.observed
        span = omax - omin
        text = f"calibration range of {layer.tensor} is [{lo:.4g}, {hi:.4g}], observed [{omin:.4g}, {omax:.4g}]"
        if layer.saturation is not None and layer.saturation > narrow:
            hints.append(f"{text}: {layer.saturation:.1%} of its values are clipped (range too narrow)")
        elif span > 0 and (hi - lo) > wide * span:
            hints.append(f"{text}: the range is {(hi - lo) / span:.0f}x wider than the values (coarse steps)")
        elif omin >= 0 and span > 0 and lo < -0.25 * span:
            hints.append(f"{text}: the FP32 values are never negative but the range admits negatives "
                         "(a Relu absorbed into this quantization is lost)")
        elif abs(lo + 6) < 0.1 and abs(hi - 6) < 0.1:
            hints.append(f"{text}: this is the default range of an uncalibrated tensor")
    return hints


# --- the whole answer -------------------------------------------------------------------


@dataclass
class Explanation:
    candidate: str
    reference: str
    targets: dict[str, TierExplain] = field(default_factory=dict)
    mixed_precision: dict | None = None
    fixes: dict | None = None            # explain --fix: fixes.FixReport's JSON (docs/json-shapes.md)

    def to_json(self) -> dict:
        doc = {"candidate": self.candidate, "reference": self.reference,
               "targets": {name: item.to_json() for name, item in self.targets.items()}}
        if self.mixed_precision is not None:
            doc["mixed_precision"] = self.mixed_precision
        if self.fixes is not None:
            doc["fixes"] = self.fixes
        return doc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, doc: dict) -> "Explanation":
        """Back from to_json() (a recorded explanation: the drift report renders it); a number recorded
        as null (not finite) comes back as NaN."""
        def number(value) -> float:
            return float("nan") if value is None else float(value)

        targets = {}
        for name, item in (doc.get("targets") or {}).items():
            suggestions = item.get("suggestions") or {}
            layers = [Layer(tensor=x["tensor"], op=x.get("op", ""), sqnr_db=number(x.get("sqnr_db")),
                            cosine=number(x.get("cosine")), max_abs_error=number(x.get("max_abs_error")),
                            saturation=x.get("saturation"), range=x.get("range"), observed=list(x.get("observed") or []),
                            candidate_tensor=x.get("candidate_tensor", ""), nodes=list(x.get("nodes") or []),
                            location=list(x.get("location") or []))
                      for x in item.get("layers") or []]
            e2e = item.get("end_to_end_sqnr_db")
            targets[name] = TierExplain(name, number(item.get("threshold_db")), layers, item.get("first_divergent"),
                                        None if e2e is None else float(e2e), list(item.get("unpaired") or []),
                                        list(item.get("skipped") or []), list(suggestions.get("keep_float") or []),
                                        list(suggestions.get("calibration") or []), float(item.get("seconds") or 0.0),
                                        item.get("machine", ""), item.get("error", ""),
                                        dict(item.get("unpaired_reasons") or {}))
        return cls(doc.get("candidate", ""), doc.get("reference", ""), targets, doc.get("mixed_precision"),
                   doc.get("fixes"))

    def keep_float(self) -> list[str]:
        nodes: list[str] = []
        for item in self.targets.values():
            nodes += [n for n in item.keep_float if n not in nodes]
        return nodes

    def reasons(self) -> list[str]:
        """One line per tier naming its first divergent layer (for a gate's reasons)."""
        lines = []
        for name, item in self.targets.items():
            if item.error:
                lines.append(f"{name}: explain failed: {item.error}")
            elif item.first_divergent is None:
                lines.append(f"{name}: no layer falls below {item.threshold_db:g} dB SQNR")
            else:
                layer = next(x for x in item.layers if x.tensor == item.first_divergent)
                lines.append(f"{name}: first divergent layer {layer.tensor} ({layer.op}), "
                             f"SQNR {layer.sqnr_db:.1f} dB < {item.threshold_db:g} dB")
        return lines


def markdown_table(explanation: Explanation, n: int = 5) -> str:
    """The worst layers per tier, as Markdown (for reports and Prefect artifacts)."""
    lines = ["## Which layer, on which tier", ""]
    for name, item in explanation.targets.items():
        lines.append(f"### `{name}`")
        if item.error:
            lines += [f"explain failed: {item.error}", ""]
            continue
        lines.append(f"first divergent: `{item.first_divergent}`" if item.first_divergent else
                     f"no layer below {item.threshold_db:g} dB")
        lines += ["", "| tensor | op | SQNR dB | cosine | max abs err | saturation |", "|---|---|---|---|---|---|"]
        for layer in item.worst(n):
            sat = "" if layer.saturation is None else f"{layer.saturation:.1%}"
            lines.append(f"| `{layer.tensor}` | {layer.op} | {layer.sqnr_db:.1f} | {layer.cosine:.4f} | "
                         f"{layer.max_abs_error:.4g} | {sat} |")
        if item.keep_float:
            lines.append(f"\nkeep in float: {', '.join(f'`{x}`' for x in item.keep_float)}")
        lines += [f"- {hint}" for hint in item.calibration]
        if item.skipped:
            lines.append(f"\nskipped (inside subgraphs, not exposable): {', '.join(item.skipped)}")
        if item.unpaired:
            lines.append("\ncannot be paired: " + "; ".join(
                f"{name} ({item.unpaired_reasons[name]})" if name in item.unpaired_reasons else name
                for name in item.unpaired))
        lines.append("")
    if explanation.fixes:
        from tiergate.explain.fixes import markdown_fixes

        lines.append(markdown_fixes(explanation.fixes))
    return "\n".join(lines) + "\n"
