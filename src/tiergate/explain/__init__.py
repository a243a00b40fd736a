"""Which layer lost it: pair a candidate's intermediate tensors with its FP32 reference's, per tier.

This module is the pure part of `tiergate explain` (no Docker): it prepares the models whose
intermediate tensors a tier's runtime will dump (tiergate.execution.explain runs them inside
each tier's container with containers/harness/tiergate_explain.py), pairs the dumped tensors,
computes per paired FP32 tensor SQNR (dB), cosine, max abs error and the share of values
saturated at the quantization range's ends, finds the first divergent tensor, and suggests
what to keep in float and which calibration range to look at.

ONNX pairing (QDQ, QOperator or float candidates) is onnx_pairing.py: by name, by the quantizers' naming
conventions, then by structure (through Q/DQ, fused activations, QLinear* ops), exposing only what keeps the
candidate's integer kernels fused; what stays unpaired is said with a reason per tensor. An If whose condition the
evaluation data fix (silero VAD's `If(sr == 16000)`) is first replaced by the branch taken, in both models
(specialize.py, checked to give the same outputs), so the tensors inside it pair too; the branches taken are reported.

TFLite pairing (tflite_pairing.py, read from both flatbuffers before any tier runs): the same name
first, then structure: both graphs walked from their inputs, through the QUANTIZE / DEQUANTIZE ops
the converter inserts, fused activations and dequantized weights; each candidate tensor left
unpaired says why (Plan.reasons). The interpreter runs with
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
from tiergate.explain import onnx_pairing
from tiergate.explain.pairs import Plan, Source

plan_onnx = onnx_pairing.plan_onnx               # the ONNX pairing, re-exported
quantized_nodes = onnx_pairing.quantized_nodes

DEFAULT_THRESHOLD_DB = 20.0
SQNR_CAP_DB = 200.0
MIN_DROP_DB = 1.0            # a layer that loses less than this relative to the one before adds no noise of its own          # identical tensors: reported as this, JSON has no infinity


# --- the plan: which tensor of the candidate pairs with which FP32 tensor (pairs.py, per format beside it) ---


def plan(candidate: Path, reference: Path, work: Path, feeds: list[dict[str, np.ndarray]] | None = None) -> Plan:
    """Prepare the models to dump (written under `work`) and the pairing, by format. `feeds`: the evaluation samples
    (one dict of model inputs per sample), which fix an ONNX model's If conditions (specialize.py)."""
    from tiergate.artifact.detect import detect_format, read_model_file

    fmt = detect_format(Path(candidate), read_model_file(Path(candidate)))
    if fmt != detect_format(Path(reference), read_model_file(Path(reference))):
        raise InputError(f"{candidate} and {reference}: the candidate and the reference are in different formats")
    work.mkdir(parents=True, exist_ok=True)
    if fmt == "tflite":
        from tiergate.explain.tflite_pairing import pair

        found = pair(Path(candidate), Path(reference))
        return Plan("tflite", Path(candidate), Path(reference), [Source(**item) for item in found.sources],
                    unpaired=sorted(found.unpaired), outputs=found.outputs, reasons=dict(found.unpaired))
    return onnx_pairing.plan_onnx(Path(candidate), Path(reference), work, feeds)


# --- the figures ------------------------------------------------------------------------


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """20*log10(|ref| / |ref - out|), as onnxruntime's qdq_loss_debug; identical -> SQNR_CAP_DB."""
    ref = ref.astype(np.float64).ravel()
    # sums of squares, not np.linalg.norm: a 1-D norm is a BLAS dot, whose threads crawl on a busy machine
    noise = math.sqrt(float(np.square(ref - out.astype(np.float64).ravel()).sum()))
    signal = math.sqrt(float(np.square(ref).sum()))
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
    nodes: list[str] = field(default_factory=list)        # the candidate's own nodes (keep-float candidates)
    fp32_nodes: list[str] = field(default_factory=list)   # the same in the FP32 reference (nodes_to_exclude)
    paired_by: str = ""                                   # the evidence: name, convention, structure, ...
    location: list[str] = field(default_factory=list)    # TFLite: the candidate op's location, where the file keeps it

    def to_json(self) -> dict:
        return {k: (_round(v) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def _channels(source: Source, cand: np.ndarray):
    """A per-channel source's scales and zero points shaped to broadcast over `cand` (sample axis first)."""
    shape = [1] * cand.ndim
    axis = source.axis % max(cand.ndim - 1, 1) + 1
    if cand.ndim < 2 or cand.shape[axis] != len(source.scales):
        raise ValueError(f"{len(source.scales)} per-channel scales along axis {source.axis} of a {cand.shape[1:]} tensor")
    shape[axis] = -1
    return (np.array(source.scales, np.float32).reshape(shape),
            np.array(source.zero_points, np.float32).reshape(shape))


def measure(source: Source, cand: np.ndarray, ref: np.ndarray) -> Layer:
    """The figures of one pair (arrays with the sample axis first), a sample at a time: a detector's tensor over a
    few samples is hundreds of MB in float64, so nothing the size of the whole pair is made."""
    if cand.size != ref.size:
        raise ValueError(f"shapes differ: {cand.shape} vs {ref.shape}")
    saturation, rng, dequantize = None, None, None
    if source.scale is not None or source.scales:
        if source.scales:              # per channel: in the candidate's own layout, then as the reference's
            scale, zero_point = _channels(source, cand)
            info = np.iinfo(np.dtype(source.dtype))
            lo, hi = (info.min - zero_point) * scale, (info.max - zero_point) * scale
            rng = [_round(float(lo.min())), _round(float(hi.max()))]
        else:
            scale, zero_point = source.scale, source.zero_point
            lo, hi = qrange(source.scale, source.zero_point, source.dtype)
            rng = [_round(lo), _round(hi)]
        # clipped = more than one quantization step beyond the representable end: a softmax's 1.0 against
        # an int8 top of 255/256 is rounding, not saturation (no false "range too narrow" hint)
        dequantize = (scale, zero_point, lo - 1.01 * scale, hi + 1.01 * scale)
    noise = signal = 0.0
    worst, clipped, cosines, lows, highs = 0.0, 0, [], [], []
    rows = len(ref) if ref.ndim else 1
    for s in range(rows):
        r = (ref[s:s + 1] if ref.ndim else ref).astype(np.float32)
        c = cand[s:s + 1] if cand.ndim else cand
        if dequantize is not None:
            scale, zero_point, below, above = dequantize
            seen = r.reshape(c.shape)
            clipped += int(np.count_nonzero((seen < below) | (seen > above)))
            c = ((c.astype(np.float32) - zero_point) * scale).astype(np.float32)
        c = c.reshape(r.shape).astype(np.float32)
        if not r.size:
            continue
        # einsum, not a 1-D dot or norm: those are BLAS calls, whose threads crawl on a busy machine
        a, b = r.astype(np.float64).ravel(), c.astype(np.float64).ravel()
        diff = a - b
        na, nb, ab = (float(np.einsum("i,i->", x, y)) for x, y in ((a, a), (b, b), (a, b)))
        noise += float(np.einsum("i,i->", diff, diff))
        signal += na
        worst = max(worst, float(np.max(np.abs(r - c))))
        cosines.append(1.0 if na == 0 and nb == 0 else ab / max(math.sqrt(na) * math.sqrt(nb), 1e-30))
        lows.append(float(r.min()))
        highs.append(float(r.max()))
    if dequantize is not None:
        saturation = clipped / ref.size if ref.size else 0.0
    if noise == 0:
        sqnr = SQNR_CAP_DB
    elif signal == 0:
        sqnr = -SQNR_CAP_DB
    else:
        sqnr = float(max(-SQNR_CAP_DB, min(SQNR_CAP_DB, 10 * math.log10(signal / noise))))
    observed = [_round(min(lows)), _round(max(highs))] if lows else []
    return Layer(source.fp32, source.op, sqnr, float(np.mean(cosines)) if cosines else 1.0, worst, saturation, rng,
                 observed, source.tensor, source.nodes, list(source.fp32_nodes), source.how, list(source.location))


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
    keep_float: list[str] = field(default_factory=list)      # the candidate's nodes (ONNX) or tensors (TFLite)
    calibration: list[str] = field(default_factory=list)
    seconds: float = 0.0
    machine: str = ""
    error: str = ""
    unpaired_reasons: dict[str, str] = field(default_factory=dict)   # why each of `unpaired` is
    fp32_unpaired: dict[str, str] = field(default_factory=dict)      # FP32 tensors the candidate never holds, why
    keep_float_fp32: list[str] = field(default_factory=list)         # keep_float in the FP32 reference's nodes
    branches: list[dict] = field(default_factory=list)               # Ifs replaced by the branch taken, and why
    skipped_reasons: dict[str, str] = field(default_factory=dict)    # why each of `skipped` stays in a subgraph
    samples: int = 0                                                 # the samples dumped and compared
    samples_note: str = ""                                           # why fewer than asked (the tier's memory)
    sample_bytes: int = 0                                            # a sample's dumped tensors, both models
    peak_bytes: int = 0                                              # the dump process's peak resident memory

    def to_json(self) -> dict:
        return {"first_divergent": self.first_divergent, "threshold_db": self.threshold_db,
                "end_to_end_sqnr_db": None if self.end_to_end_sqnr_db is None else _round(self.end_to_end_sqnr_db),
                "layers": [layer.to_json() for layer in self.layers],
                "suggestions": {"keep_float": self.keep_float, "keep_float_fp32": self.keep_float_fp32,
                                "calibration": self.calibration},
                "unpaired": self.unpaired, "unpaired_reasons": self.unpaired_reasons,
                "fp32_unpaired": self.fp32_unpaired, "skipped": self.skipped, "skipped_reasons": self.skipped_reasons,
                "branches": self.branches, "seconds": round(self.seconds, 3), "samples": self.samples,
                "samples_note": self.samples_note, "sample_bytes": self.sample_bytes, "peak_bytes": self.peak_bytes,
                "machine": self.machine, "error": self.error}

    def worst(self, n: int = 5) -> list[Layer]:
        return sorted(self.layers, key=lambda layer: layer.sqnr_db)[:n]


def analyse(plan_: Plan, target: str, dumps: dict[str, dict[str, np.ndarray]], *, threshold_db: float,
            meta: dict | None = None) -> TierExplain:
    """Pair one tier's dumps ({"candidate": {tensor: array}, "reference": {...}}) and judge them."""
    meta = meta or {}
    cand, ref = dumps.get("candidate", {}), dumps.get("reference", {})
    sources = list(plan_.sources)
    result = TierExplain(target, threshold_db, skipped=list(plan_.skipped), unpaired=list(plan_.unpaired),
                         machine=meta.get("machine", ""), seconds=float(meta.get("seconds", 0.0)),
                         unpaired_reasons=dict(plan_.reasons), fp32_unpaired=dict(plan_.fp32_unpaired),
                         branches=[dict(b) for b in plan_.branches], skipped_reasons=dict(plan_.skipped_reasons))
    if plan_.format == "tflite":
        from tiergate.explain.tflite_pairing import runtime_checked

        sources, more = runtime_checked(sources, meta)
        result.unpaired += list(more)
        result.unpaired_reasons.update(more)
    inputs = meta.get("inputs", {})
    best: dict[str, Layer] = {}
    for source in sources:
        c = cand.get(source.tensor, inputs.get(source.tensor))
        r = ref.get(source.fp32, inputs.get(source.fp32))
        if c is None or r is None:
            result.unpaired.append(source.tensor)
            result.unpaired_reasons.setdefault(source.tensor, "the tier's runtime kept no values of it" if c is None
                                               else f"the tier's runtime kept no values of its FP32 tensor {source.fp32}")
            continue
        try:
            layer = measure(source, c, r)
        except ValueError as exc:
            result.unpaired.append(source.tensor)
            result.unpaired_reasons.setdefault(source.tensor, f"not comparable with {source.fp32}: {exc}")
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
    result.unpaired_reasons = {name: why for name, why in result.unpaired_reasons.items() if name in result.unpaired}
    result.first_divergent = next((layer.tensor for layer in result.layers if layer.sqnr_db < threshold_db), None)
    outputs = [best[name] for name in plan_.outputs if name in best]
    if outputs:
        result.end_to_end_sqnr_db = min(layer.sqnr_db for layer in outputs)
    result.keep_float = keep_float(result.layers, threshold_db, set(plan_.outputs))
    result.keep_float_fp32 = keep_float(result.layers, threshold_db, set(plan_.outputs), attr="fp32_nodes")
    result.calibration = calibration_hints(result.layers)
    return result


def keep_float(layers: list[Layer], threshold_db: float, outputs: set[str], limit: int = 3,
               attr: str = "nodes") -> list[str]:
    """The nodes to keep in float, worst first: the nodes the candidate quantized around the `limit` worst
    layers that have any (worst_layers' ranking; an estimate: --mixed-precision verifies it end to end).
    attr="fp32_nodes": the same layers' nodes named as in the FP32 reference."""
    nodes: list[str] = []
    for layer in [x for x in worst_layers(layers, threshold_db, outputs) if getattr(x, attr)][:limit]:
        nodes += [n for n in getattr(layer, attr) if n not in nodes]
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
                            fp32_nodes=list(x.get("fp32_nodes") or []), paired_by=x.get("paired_by", ""),
                            location=list(x.get("location") or []))
                      for x in item.get("layers") or []]
            e2e = item.get("end_to_end_sqnr_db")
            targets[name] = TierExplain(name, number(item.get("threshold_db")), layers, item.get("first_divergent"),
                                        None if e2e is None else float(e2e), list(item.get("unpaired") or []),
                                        list(item.get("skipped") or []), list(suggestions.get("keep_float") or []),
                                        list(suggestions.get("calibration") or []), float(item.get("seconds") or 0.0),
                                        item.get("machine", ""), item.get("error", ""),
                                        dict(item.get("unpaired_reasons") or {}), dict(item.get("fp32_unpaired") or {}),
                                        list(suggestions.get("keep_float_fp32") or []),
                                        list(item.get("branches") or []), dict(item.get("skipped_reasons") or {}),
                                        int(item.get("samples") or 0), item.get("samples_note", ""),
                                        int(item.get("sample_bytes") or 0), int(item.get("peak_bytes") or 0))
        return cls(doc.get("candidate", ""), doc.get("reference", ""), targets, doc.get("mixed_precision"),
                   doc.get("fixes"))

    def keep_float(self, fp32: bool = False) -> list[str]:
        """Every tier's keep-float nodes: the candidate's own, or (fp32=True) the FP32 reference's."""
        nodes: list[str] = []
        for item in self.targets.values():
            nodes += [n for n in (item.keep_float_fp32 if fp32 else item.keep_float) if n not in nodes]
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
        lines += [f"- {line}" for line in branch_lines(item) + skipped_lines(item)]
        lines += ["", *unpaired_lines(item, prefix="- ", quote="`")]
        lines.append("")
    if explanation.fixes:
        from tiergate.explain.fixes import markdown_fixes

        lines.append(markdown_fixes(explanation.fixes))
    return "\n".join(lines) + "\n"


def branch_lines(item: TierExplain) -> list[str]:
    """One line per If replaced by the branch the evaluation data take: "branch taken: If_0: then_branch (sr == 16000
    in every sample)"."""
    lines = []
    for b in item.branches:
        models = b.get("models") or []
        whose = "" if len(models) != 1 else f" [{models[0]} only]"
        lines.append(f"branch taken: {b.get('node')}: {b.get('branch')} ({b.get('why')}){whose}")
    return lines


def skipped_lines(item: TierExplain, limit: int = 6) -> list[str]:
    """What stays inside subgraphs (not exposable), one line per reason with a few of its tensors."""
    by_reason: dict[str, list[str]] = {}
    for name in item.skipped:
        by_reason.setdefault(item.skipped_reasons.get(name, "inside a subgraph"), []).append(name)
    lines = []
    for why, names in by_reason.items():
        shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
        lines.append(f"skipped (not exposable): {len(names)} tensor{'s' * (len(names) != 1)} {why}: {shown}")
    return lines


def unpaired_lines(item: TierExplain, limit: int = 12, prefix: str = "  ", quote: str = "") -> list[str]:
    """What stays unpaired on one tier, and why: a heading per side, then one `prefix tensor: reason` line each (at
    most `limit` a side; the JSON lists all)."""
    lines = []
    for title, reasons in (("cannot be paired (candidate tensors that stand for no FP32 tensor)",
                            {n: item.unpaired_reasons.get(n, "no FP32 tensor of the same name; not guessed")
                             for n in item.unpaired}),
                           ("FP32 tensors the candidate never holds", item.fp32_unpaired)):
        if not reasons:
            continue
        lines.append(f"{title}: {len(reasons)}")
        lines += [f"{prefix}{quote}{name}{quote}: {why}" for name, why in list(reasons.items())[:limit]]
        if len(reasons) > limit:
            lines.append(f"{prefix}... and {len(reasons) - limit} more")
    return lines
