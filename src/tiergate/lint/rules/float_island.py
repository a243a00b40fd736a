"""float-island: float compute between quantized regions of a quantized graph. Each
connected run of float nodes with quantized nodes both upstream and downstream is
one finding: the values are dequantized, computed in float, and quantized again.
On a compiled tier (TVM's lowered graph, tiergate.lint.kernels) a kernel's precision is
its compute operator's input type; a quantized model none of whose compute kernels reads
integers computes wholly in float there, which is one finding naming them all."""

from __future__ import annotations

RULE = "float-island"
SEVERITY = "warning"
DESCRIPTION = "float compute between quantized regions of a quantized graph"


def check(ctx) -> list:
    from tiergate.lint.rules.dynamic_quantization import is_dynamic

    if not ctx.artifact.is_quantized or is_dynamic(ctx.artifact):     # float between a dynamic model's integer
        return []                                                      # ops is its design (dynamic-quantization)
    kinds = ctx.precision
    if ctx.artifact.format == "tvm" and "quantized" not in kinds:
        return _all_float(ctx)
    islands = []
    seen: set[int] = set()
    for node in ctx.artifact.nodes:
        if kinds[node.index] != "float" or node.index in seen:
            continue
        island = _component(ctx, node.index)
        seen |= island
        if _reaches(ctx, island, upstream=True) and _reaches(ctx, island, upstream=False):
            islands.append(sorted(island))
    return [ctx.file_finding(
        RULE, SEVERITY,
        f"{len(island)} float node(s) ({', '.join(sorted({ctx.artifact.nodes[i].op for i in island}))}) "
        f"between quantized regions: dequantize, float compute, requantize",
        island) for island in islands]


def _neighbours(ctx, i: int, upstream: bool) -> list[int]:
    node = ctx.artifact.nodes[i]
    return ctx.index.prev_nodes(node) if upstream else ctx.index.next_nodes(node)


def _component(ctx, start: int) -> set[int]:
    """Float nodes connected to `start` through float nodes."""
    found, todo = {start}, [start]
    while todo:
        i = todo.pop()
        for j in _neighbours(ctx, i, True) + _neighbours(ctx, i, False):
            if ctx.precision[j] == "float" and j not in found:
                found.add(j)
                todo.append(j)
    return found


def _reaches(ctx, island: set[int], upstream: bool) -> bool:
    """Whether a quantized node lies upstream (or downstream) of the island, through neutral nodes."""
    todo = [j for i in island for j in _neighbours(ctx, i, upstream) if j not in island]
    seen: set[int] = set()
    while todo:
        j = todo.pop()
        if j in seen:
            continue
        seen.add(j)
        if ctx.precision[j] == "quantized":
            return True
        if ctx.precision[j] == "neutral":
            todo.extend(_neighbours(ctx, j, upstream))
    return False


def _all_float(ctx) -> list:
    """A quantized model whose compiled kernels all compute in float (TVM imports QuantizeLinear/DequantizeLinear
    as quantize and dequantize around float arithmetic)."""
    from tiergate.lint import kernels

    computing = [n.index for n in ctx.artifact.nodes if ctx.precision[n.index] == "float"]
    if not computing:
        return []
    ops = sorted({kernels.compute(ctx.artifact.nodes[i])[0] for i in computing})
    requantized = any(name in kernels.QUANTIZE for node in ctx.artifact.nodes for name in kernels.names(node))
    return [ctx.finding(
        RULE, SEVERITY,
        f"the quantized model computes in float on this tier: all {len(computing)} compute kernel(s) "
        f"({', '.join(ops)}) read float data"
        + ("; its quantize/dequantize pairs only round the values (fake quantization), so it keeps INT8's error "
           "without INT8's speed" if requantized else ""),
        computing)]
