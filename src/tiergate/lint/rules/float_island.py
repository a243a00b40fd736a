"""float-island: float compute between quantized regions of a quantized graph. Each
connected run of float nodes with quantized nodes both upstream and downstream is
one finding: the values are dequantized, computed in float, and quantized again."""

from __future__ import annotations

RULE = "float-island"
SEVERITY = "warning"
DESCRIPTION = "float compute between quantized regions of a quantized graph"


def check(ctx) -> list:
    if not ctx.artifact.is_quantized:
        return []
    kinds = ctx.precision
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
