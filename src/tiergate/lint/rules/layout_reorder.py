"""layout-reorder: a runtime graph that converts the activations' memory layout back and forth
between its convolutions instead of once on the way in and once on the way out.

onnxruntime's NCHWc transformer (x86_64) runs convolutions on a blocked layout and inserts
ReorderInput (NCHW -> NCHWc) and ReorderOutput (NCHWc -> NCHW) where the graph leaves the ops it
has an NCHWc kernel for. Judged by the graph's edges: the NCHWc regions (nodes joined by blocked
tensors) that hold convolutions. One region is the cost of the layout; several mean a reorder
round trip between them, paid for every inference. A warning when every convolution is a region
of its own (reorders around every conv), else information. Names the reorder nodes
and says which ops, between the regions, have no NCHWc kernel. Only a runtime graph has such
nodes; a file without them gets nothing.
"""

from __future__ import annotations

from collections import Counter

RULE = "layout-reorder"
SEVERITY = "warning"
DESCRIPTION = "memory-layout reorders between convolutions in the graph the runtime runs (NCHWc)"

BLOCKED = "com.microsoft.nchwc"
REORDERS = ("ReorderInput", "ReorderOutput")


def check(ctx) -> list:
    nodes = ctx.artifact.nodes
    blocked = [n for n in nodes if n.domain == BLOCKED]
    convs = [n.index for n in blocked if n.op == "Conv"]
    reorders = [n.index for n in blocked if n.op in REORDERS]
    if len(convs) < 2 or not reorders:
        return []
    region = _regions(ctx)
    holding = {region[i] for i in convs}
    if len(holding) < 2:
        return []
    counts = Counter(nodes[i].op for i in reorders)
    alone = Counter(region[i] for i in convs)
    single = sum(1 for r in holding if alone[r] == 1)
    between, plain = _between(ctx, reorders)
    severity = SEVERITY if single == len(convs) else "info"
    message = (f"{len(reorders)} layout reorder(s) ({', '.join(f'{op} x{n}' for op, n in sorted(counts.items()))}) "
               f"for {len(convs)} NCHWc convolution(s) in {len(holding)} separate NCHWc regions "
               f"({single} holding a single convolution): the activations are converted between NCHW and NCHWc "
               f"around the convolutions at every inference"
               + (f"; between the regions run ops without an NCHWc kernel here: {between}" if between else "")
               + (f"; {plain} NCHWc convolution(s) start a new region from the plain layout" if plain else ""))
    return [ctx.finding(RULE, severity, message, reorders)]


def _regions(ctx) -> dict[int, int]:
    """Each blocked node's region: nodes joined by a tensor in the blocked layout (one written by a blocked
    node other than ReorderOutput and read by a blocked node)."""
    nodes = ctx.artifact.nodes
    parent = {n.index: n.index for n in nodes if n.domain == BLOCKED}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for reader in nodes:
        if reader.domain != BLOCKED:
            continue
        for tensor in reader.inputs:
            writer = ctx.index.producer.get(tensor)
            if writer is not None and nodes[writer].domain == BLOCKED and nodes[writer].op != "ReorderOutput":
                parent[root(writer)] = root(reader.index)
    return {i: root(i) for i in parent}


def _between(ctx, reorders: list[int]) -> tuple[str, int]:
    """The ops reading a ReorderOutput's plain tensor (what made the data leave the blocked layout), and how many
    blocked convolutions read one directly."""
    nodes = ctx.artifact.nodes
    readers, plain = Counter(), 0
    for i in reorders:
        if nodes[i].op != "ReorderOutput":
            continue
        for j in ctx.index.next_nodes(nodes[i]):
            if nodes[j].domain == BLOCKED:
                plain += 1
            else:
                readers[nodes[j].op] += 1
    return ", ".join(f"{op} x{n}" for op, n in readers.most_common()), plain
