"""unfolded-batchnorm: a per-channel scale and shift computed as its own kernel after a convolution,
where it could have been folded into the convolution's weights and bias.

Judged by the graph's edges and op types, in the file or in the graph a tier's runtime runs:
the normalization is a BatchNormalization, a depthwise 1x1 convolution (onnxruntime's NCHWc
transformer turns a BatchNormalization it did not fold into one), or in TFLite a MUL (and ADD)
with constant operands. It reads a convolution's output (its only reader) directly or through
no-ops (Identity, Dropout, a Clip whose bounds are beyond any value the tensor can hold: its quantization range
where the file has one, else a magnitude no activation reaches, 1e30), and the convolution carries no activation that
is not a no-op (a FusedConv's fused Clip at such bounds is one): a real
activation in between makes the fold wrong, so that is never flagged. One finding per graph,
naming every convolution, no-op and normalization it found. On a compiled tier (TVM's
lowered graph, tiergate.lint.kernels) a batch_norm computed at inference after a
convolution's kernel, without an activation between them, is one.
"""

from __future__ import annotations

from collections import Counter

RULE = "unfolded-batchnorm"
SEVERITY = "warning"
DESCRIPTION = "per-channel normalization left as its own kernel after a convolution (not folded)"

CONVS = {"Conv", "ConvTranspose", "QLinearConv", "FusedConv", "NhwcFusedConv",
         "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV"}
NOOPS = {"Identity", "Dropout"}
NO_ACTIVATION = 1e30      # a magnitude no activation reaches: a Clip bound beyond it clips nothing a network computes
_LEVELS = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}
SHOWN = 4


def check(ctx) -> list:
    if ctx.artifact.format == "tvm":
        return _lowered(ctx)
    nodes = ctx.artifact.nodes
    pairs = []          # (conv, no-ops, normalization nodes, what the normalization is)
    for node in nodes:
        norm = _normalization(ctx, node)
        if norm is None:
            continue
        conv, noops = _conv_before(ctx, node)
        if conv is None or not _foldable_activation(conv):
            continue
        pairs.append((conv, noops, [node.index] + norm[1], norm[0]))
    if not pairs:
        return []
    pointed = sorted({i for conv, noops, norm, _ in pairs for i in (conv.index, *noops, *norm)})
    shapes = Counter(_shape(ctx, conv, noops, norm, kind) for conv, noops, norm, kind in pairs)
    examples = ", ".join(f"{conv.label} -> {nodes[norm[0]].label}" for conv, _, norm, _ in pairs[:SHOWN])
    more = f" and {len(pairs) - SHOWN} more" if len(pairs) > SHOWN else ""
    why = _blockers(ctx, pairs)
    message = (f"{len(pairs)} normalization(s) run as their own kernel after a convolution, not folded into its "
               f"weights (an extra pass over the activations at inference): "
               f"{'; '.join(f'{s} x{n}' for s, n in shapes.most_common())}: {examples}{more}"
               + (f"; {why}" if why else ""))
    return [ctx.file_finding(RULE, SEVERITY, message, pointed)]


def _normalization(ctx, node) -> tuple[str, list[int]] | None:
    """What kind of per-channel normalization `node` is (and the nodes after it that belong to it), or None."""
    if node.op == "BatchNormalization":
        return "BatchNormalization", []
    if node.op == "Conv" and _depthwise_1x1(ctx, node):
        return "BatchNormalization as a depthwise 1x1 " + ("NCHWc " if "nchwc" in node.domain else "") + "Conv", []
    if node.op == "MUL" and _constant_operand(ctx, node):
        return "MUL" + (" + ADD" if _constant_add_after(ctx, node) else ""), _constant_add_after(ctx, node)
    return None


def _depthwise_1x1(ctx, node) -> bool:
    """A Conv that scales each channel by a constant (and adds one): group == channels, 1x1 weights, no stride,
    no padding."""
    weights = ctx.artifact.initializers.get(node.inputs[1]) if len(node.inputs) > 1 else None
    group = node.attributes.get("group", 1)
    if weights is None or group <= 1 or len(weights[0]) != 4 or tuple(weights[0][1:]) != (1, 1, 1):
        return False
    plain = all(s == 1 for s in node.attributes.get("strides", [1])) and not any(node.attributes.get("pads", [0]))
    return weights[0][0] == group and plain and node.attributes.get("kernel_shape", [1, 1]) == [1, 1]


def _conv_before(ctx, node):
    """The convolution whose only reader leads (through no-ops, each the only reader of the one before) to `node`."""
    noops = []
    current = node
    while True:
        data = next((t for t in current.inputs if t and t not in ctx.artifact.initializers), "")
        source = ctx.index.producer.get(data)
        if source is None:
            return None, []
        before = ctx.artifact.nodes[source]
        if ctx.index.sole_consumer(before) != current.index:
            return None, []
        if before.op in CONVS:
            return before, noops[::-1]
        if not _is_noop(ctx, before):
            return None, []
        noops.append(before.index)
        current = before


def _is_noop(ctx, node) -> bool:
    if node.op in NOOPS:
        return True
    return node.op == "Clip" and _whole_range(_clip_bounds(ctx, node), _reach(ctx, node.inputs[0]))


def _reach(ctx, tensor: str) -> tuple[float, float] | None:
    """The values a tensor can hold where the file says it: its quantization range (its own, or that of the
    quantized tensor its DequantizeLinear reads), per tensor; None when unknown."""
    q = ctx.artifact.quant.get(tensor)
    source = ctx.index.producer.get(tensor)
    if q is None and source is not None and ctx.artifact.nodes[source].op == "DequantizeLinear":
        q = ctx.artifact.quant.get(ctx.artifact.nodes[source].inputs[0])
    if q is None or len(q.scale) != 1 or q.dtype not in _LEVELS:
        return None
    qmin, qmax = _LEVELS[q.dtype]
    return (qmin - q.zero_point[0]) * q.scale[0], (qmax - q.zero_point[0]) * q.scale[0]


def _clip_bounds(ctx, node) -> tuple[float | None, float | None]:
    """A Clip's bounds (opset 6's attributes or opset 11's constant inputs); None where absent (no bound), a
    non-constant bound as NaN (unknown)."""
    if "min" in node.attributes or "max" in node.attributes:
        return node.attributes.get("min"), node.attributes.get("max")
    return tuple(_constant(ctx, node.inputs[k]) if len(node.inputs) > k and node.inputs[k] else None
                 for k in (1, 2))


def _whole_range(bounds, reach: tuple[float, float] | None = None) -> bool:
    """The bounds clip no value the tensor can hold: each absent, beyond any magnitude an activation reaches
    (NO_ACTIVATION: a Clip to +-3.4e38 is 0.08 % inside float32's largest value, and clips nothing all the same),
    or beyond the tensor's own range where the file says it (`reach`). A bound that is not a constant (NaN) is
    never a no-op."""
    low, high = bounds
    lowest, highest = reach if reach is not None else (None, None)
    return ((low is None or low <= -NO_ACTIVATION or (lowest is not None and low <= lowest))
            and (high is None or high >= NO_ACTIVATION or (highest is not None and high >= highest)))


def _foldable_activation(conv) -> bool:
    """The convolution applies no activation, or one that changes nothing (a Clip over the float range)."""
    activation = conv.attributes.get("activation") or conv.attributes.get("fused_activation_function")
    if activation in (None, "", "NONE"):
        return True
    params = conv.attributes.get("activation_params") or []
    return activation == "Clip" and len(params) == 2 and _whole_range(params)


def _constant(ctx, tensor: str) -> float | None:
    """The value of a scalar constant tensor (an initializer or a Constant node's output), NaN when unknown."""
    import numpy as np

    values = _constants(ctx)
    value = values.get(tensor)
    if value is None or value.size != 1:
        return float("nan")
    return float(np.asarray(value, np.float64).reshape(()))


def _constants(ctx) -> dict:
    """Scalar constants of an ONNX graph, read once per context."""
    if "scalar_constants" in ctx.memo:
        return ctx.memo["scalar_constants"]
    from onnx import numpy_helper

    found = {}
    model = ctx.artifact.handle
    graph = getattr(model, "graph", None)
    if graph is not None:
        for t in graph.initializer:
            if len(t.dims) == 0 or (len(t.dims) == 1 and t.dims[0] == 1):
                found[t.name] = numpy_helper.to_array(t)
        for n in graph.node:
            if n.op_type == "Constant" and n.output:
                for a in n.attribute:
                    if a.name == "value" and a.t.ByteSize() and len(a.t.dims) <= 1:
                        found[n.output[0]] = numpy_helper.to_array(a.t)
    ctx.memo["scalar_constants"] = found
    return found


def _constant_operand(ctx, node) -> bool:
    return any(t in ctx.artifact.initializers for t in node.inputs)


def _constant_add_after(ctx, node) -> list[int]:
    nxt = ctx.index.sole_consumer(node)
    if nxt is not None and ctx.artifact.nodes[nxt].op == "ADD" and _constant_operand(ctx, ctx.artifact.nodes[nxt]):
        return [nxt]
    return []


def _op(node) -> str:
    short = {"com.microsoft": "", "com.microsoft.nchwc": "NCHWc "}.get(node.domain, "")
    return short + node.op


def _shape(ctx, conv, noops, norm, kind) -> str:
    between = [_op(ctx.artifact.nodes[i]) for i in noops]
    return " -> ".join([_op(conv), *between, kind])


def _blockers(ctx, pairs) -> str:
    """Why the runtime (or a converter) did not fold them: the no-ops in between, a no-op activation fused."""
    said = []
    noops = Counter(ctx.artifact.nodes[i].op for _, noops, _, _ in pairs for i in noops)
    if noops:
        said.append("the no-op(s) between them (" + ", ".join(f"{op} x{n}" for op, n in noops.most_common())
                    + ", a Clip whose bounds no value reaches clips nothing) stop the fold: remove them")
    fused = sum(1 for conv, _, _, _ in pairs if conv.attributes.get("activation") == "Clip")
    if fused:
        said.append(f"{fused} convolution(s) carry a fused Clip whose bounds no value reaches (a no-op between "
                    "the convolution and its normalization, fused in) that stopped the fold: remove it from the model")
    return "; ".join(said)


def _lowered(ctx) -> list:
    """TVM's kernels: a batch_norm whose kernel reads a convolution's kernel (its only reader) that ends with the
    convolution or with elementwise operators that are no activation."""
    from tiergate.lint import kernels

    nodes = ctx.artifact.nodes
    pairs = []
    for node in nodes:
        after = ctx.index.sole_consumer(node)
        names = kernels.names(node)
        if after is None or not any(name.startswith("conv") for name in names):
            continue
        tail = names[max(i for i, name in enumerate(names) if name.startswith("conv")):]
        following = kernels.names(nodes[after])
        if any(name in kernels.ACTIVATIONS for name in tail) or not following or \
                following[0] not in kernels.NORMALIZATIONS:
            continue
        pairs.append((node.index, after))
    if not pairs:
        return []
    examples = ", ".join(f"{nodes[a].op} -> {nodes[b].op}" for a, b in pairs[:SHOWN])
    more = f" and {len(pairs) - SHOWN} more" if len(pairs) > SHOWN else ""
    return [ctx.finding(RULE, SEVERITY,
                        f"{len(pairs)} batch_norm(s) computed at inference in a kernel after a convolution's, not "
                        f"folded into its weights (TVM's pipeline does not fold them): {examples}{more}",
                        sorted({i for pair in pairs for i in pair}))]
