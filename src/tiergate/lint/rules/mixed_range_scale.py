"""mixed-range-scale: one quantization scale over values of very different range. A Concat whose output is
quantized with one scale (a detector's head: box coordinates in pixels beside class scores in [0, 1]) leaves
an input whose own range is a small part of it only a few levels of that scale: its values are lost (INT8 of a
YOLO-style head: 246 detections became 26, class-score SQNR 0.2 dB, while the whole output's cosine was 0.9992).
An input's range is its own quantization scale times the levels of its type, or [0, 1] for a sigmoid's or
softmax's output; the finding names each input that keeps fewer than 256 / RATIO levels."""

from __future__ import annotations

RULE = "mixed-range-scale"
SEVERITY = "warning"
DESCRIPTION = "one quantization scale over inputs of very different range (boxes and scores in one Concat)"
RATIO = 16.0                     # an input whose range is a 16th of the output's keeps at most 16 of 256 levels
_LEVELS = {"int8": 255, "uint8": 255, "int16": 65535, "uint16": 65535, "int4": 15, "uint4": 15}
_PROBABILITY = ("Sigmoid", "Softmax", "HardSigmoid", "LOGISTIC", "SOFTMAX")
_THROUGH = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "RESHAPE", "TRANSPOSE",
            "SQUEEZE", "EXPAND_DIMS")


def check(ctx) -> list:
    if not ctx.artifact.is_quantized:
        return []
    findings = []
    for node in ctx.artifact.nodes:
        if node.op not in ("Concat", "CONCATENATION") or not node.outputs:
            continue
        out = _output_params(ctx, node)
        if out is None or len(out.scale) != 1 or out.dtype not in _LEVELS or out.scale[0] <= 0:
            continue
        out_range = out.scale[0] * _LEVELS[out.dtype]
        small = []
        for k, name in enumerate(node.inputs):
            found = _input_range(ctx, name)
            if found is not None and found[0] > 0 and out_range / found[0] >= RATIO:
                small.append(f"input {k} ('{name}', a range of {found[0]:.3g}{found[1]}) keeps about "
                             f"{found[0] / out.scale[0]:.1f} levels")
        if small:
            findings.append(ctx.finding(
                RULE, SEVERITY,
                f"{node.op} '{node.label}' puts values of very different range under one quantization scale "
                f"({out.scale[0]:.4g}, a range of {out_range:.4g}): {'; '.join(small)}; quantize the parts apart "
                "(keep this Concat and its inputs in float, or give each part an output of its own)",
                [node.index]))
    return findings


def _output_params(ctx, node):
    """The quantization of the node's output: a QuantizeLinear reading it (ONNX QDQ), or its own (TFLite)."""
    name = node.outputs[0]
    if ctx.artifact.format == "tflite":
        return ctx.artifact.quant.get(name)
    for j in ctx.index.consumers.get(name, []):
        reader = ctx.artifact.nodes[j]
        if reader.op == "QuantizeLinear" and reader.outputs:
            return ctx.artifact.quant.get(reader.outputs[0])
    return None


def _input_range(ctx, name: str):
    """(range, what it is) of a tensor: its own quantization, or [0, 1] from a sigmoid or softmax."""
    seen = 0
    while seen < 6:
        seen += 1
        if ctx.artifact.format == "tflite" and name in ctx.artifact.quant:
            q = ctx.artifact.quant[name]
            if len(q.scale) == 1 and q.dtype in _LEVELS:
                return q.scale[0] * _LEVELS[q.dtype], ""
        source = ctx.index.producer.get(name)
        if source is None:
            return None
        node = ctx.artifact.nodes[source]
        if node.op == "DequantizeLinear" and node.inputs and node.inputs[0] in ctx.artifact.quant:
            q = ctx.artifact.quant[node.inputs[0]]
            if len(q.scale) == 1 and q.dtype in _LEVELS:
                return q.scale[0] * _LEVELS[q.dtype], ""
            return None
        if node.op in _PROBABILITY:
            return 1.0, ", a probability"
        if node.op not in _THROUGH or not node.inputs:
            return None
        name = node.inputs[0]
    return None
