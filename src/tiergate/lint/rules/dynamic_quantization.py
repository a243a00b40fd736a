"""dynamic-quantization: integer ops whose weights were quantized offline and whose activations are quantized
at run time, per call (onnxruntime's quantize_dynamic: DynamicQuantizeLinear before MatMulInteger / ConvInteger;
TFLite's dynamic-range quantization: int8 weights behind float activations). Not a hazard in itself: it says
what the candidate is (quantized, though no activation has a calibrated range), so the gate judges it as one and
a float island between its integer ops is the design, not a finding."""

from __future__ import annotations

RULE = "dynamic-quantization"
SEVERITY = "info"
DESCRIPTION = "weights quantized offline, activations quantized per call"


def check(ctx) -> list:
    art = ctx.artifact
    if not is_dynamic(art):
        return []
    integer = [n.index for n in art.nodes if ctx.precision[n.index] == "quantized"]
    runtime = sum(1 for q in art.quant.values() if not q.scale)
    weights = sum(1 for q in art.quant.values() if q.scale and q.tensor in art.initializers)
    return [ctx.finding(
        RULE, SEVERITY,
        f"dynamically quantized: {weights} weight tensor(s) quantized offline, "
        + (f"{runtime} activation(s) quantized per call (no calibrated range); " if runtime else
           "activations in float (quantized per call by hybrid kernels); ")
        + f"{len(integer)} integer op(s), {sum(1 for k in ctx.precision if k == 'float')} float op(s)",
        integer)]


def is_dynamic(artifact) -> bool:
    """Quantized, and no activation has a fixed quantization range: only weights, or run-time scales."""
    quant = artifact.quant.values()
    return bool(artifact.quant) and all(not q.scale or q.tensor in artifact.initializers for q in quant)
