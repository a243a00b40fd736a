"""collapsed-calibration-range: activation ranges that calibration collapsed, because the calibration data never
exercised the tensor (blank pages, silence, an all-zero batch): the tensor then holds almost nothing after
quantization, whatever the real inputs are.

Two signs, read from the file's quantization parameters:
- a range narrower than NEAR_ZERO in all (every value the tensor really takes is clipped to about zero);
- a tensor whose values are bounded by the op that makes them (Sigmoid, HardSigmoid and Softmax in [0, 1], Tanh in
  [-1, 1]; TFLite's LOGISTIC, SOFTMAX, TANH) quantized in steps so coarse that it keeps fewer than MIN_LEVELS
  levels over everything the op can output: onnxruntime's quantizer gives a tensor it saw only as zero the scale
  1.0 (the range [0, 255]), so a blank-page detector's probability map quantizes to 0 or 1.
Both are errors: the tensor named is the float tensor quantized (a QuantizeLinear's input).
"""

from __future__ import annotations

RULE = "collapsed-calibration-range"
SEVERITY = "error"
DESCRIPTION = "an activation range collapsed by calibration data that never exercised it (e.g. blank inputs)"

NEAR_ZERO = 1e-3          # a range this narrow in all holds nothing a network computes
MIN_LEVELS = 16           # a bounded op's output kept in fewer levels than this over its whole reach
BOUNDED = {"Sigmoid": (0.0, 1.0), "HardSigmoid": (0.0, 1.0), "Softmax": (0.0, 1.0), "Tanh": (-1.0, 1.0),
           "LOGISTIC": (0.0, 1.0), "SOFTMAX": (0.0, 1.0), "TANH": (-1.0, 1.0)}
_LEVELS = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}
SHOWN = 4


def check(ctx) -> list:
    artifact = ctx.artifact
    collapsed: list[tuple[str, str, int | None]] = []      # (tensor, why, node index)
    for name, q in sorted(artifact.quant.items()):
        if name in artifact.initializers or len(q.scale) != 1 or q.dtype not in _LEVELS:
            continue
        qmin, qmax = _LEVELS[q.dtype]
        low, high = (qmin - q.zero_point[0]) * q.scale[0], (qmax - q.zero_point[0]) * q.scale[0]
        maker = _maker(ctx, name)
        op = ctx.artifact.nodes[maker].op if maker is not None else ""
        if maker is None:                    # a graph input: its QuantizeLinear is the node to point at
            maker = ctx.index.producer.get(name)
        if op in BOUNDED:
            lo, hi = BOUNDED[op]
            levels = (hi - lo) / q.scale[0] if q.scale[0] > 0 else float("inf")
            if levels < MIN_LEVELS:
                collapsed.append((_source_name(ctx, name),
                                  f"{op} output in [{lo:g}, {hi:g}] quantized over [{low:.4g}, {high:.4g}] (steps "
                                  f"of {q.scale[0]:.4g}: {max(levels, 0):.3g} level(s) over all it can hold)", maker))
                continue
        if high - low < NEAR_ZERO:
            collapsed.append((_source_name(ctx, name),
                              f"quantized over [{low:.3g}, {high:.3g}] (a range {high - low:.2g} wide)", maker))
    if not collapsed:
        return []
    shown = "; ".join(f"{name}: {why}" for name, why, _ in collapsed[:SHOWN])
    more = f"; and {len(collapsed) - SHOWN} more" if len(collapsed) > SHOWN else ""
    message = (f"{len(collapsed)} activation range(s) collapsed by calibration (calibration data that never "
               f"exercised them, such as blank inputs; recalibrate on representative data): {shown}{more}")
    return [ctx.finding(RULE, SEVERITY, message, sorted({i for _, _, i in collapsed if i is not None}))]


def _source_name(ctx, tensor: str) -> str:
    """The float tensor a QuantizeLinear's output quantizes (its input), else the tensor itself."""
    index = ctx.index.producer.get(tensor)
    node = ctx.artifact.nodes[index] if index is not None else None
    return node.inputs[0] if node is not None and node.op == "QuantizeLinear" and node.inputs else tensor


def _maker(ctx, tensor: str) -> int | None:
    """The node whose values the tensor holds: for a QuantizeLinear's output, the node that made its input."""
    index = ctx.index.producer.get(tensor)
    if index is not None and ctx.artifact.nodes[index].op == "QuantizeLinear":
        return ctx.index.producer.get(ctx.artifact.nodes[index].inputs[0])
    return index
