"""Every node of an ONNX model, control-flow bodies (If, Loop, Scan) included.

`walk(graph)` lists the nodes in nesting order: each node, then the nodes of its
body graphs (attribute by attribute) right after it. A node's `path` shows the
nesting: `If_0/then_branch/Conv_3` (a node without a name is `<op>_<position>`).

Tensor names are made unique across scopes: a name that a body graph defines
(its inputs, dense and sparse initializers and node outputs) is prefixed with the body's scope
(`If_0/then_branch/x`); a name it reads from an enclosing graph keeps that
graph's name. Top-level names are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

ATTR_GRAPH = onnx.AttributeProto.GRAPH
ATTR_GRAPHS = onnx.AttributeProto.GRAPHS


@dataclass(frozen=True)
class ScopedNode:
    index: int                 # position in the walk (global, nesting order)
    path: str                  # "If_0/then_branch/Conv_3"
    scope: str                 # "If_0/then_branch/" ("" at top level)
    parent: int | None         # walk index of the control-flow node whose body holds it
    node: onnx.NodeProto
    inputs: tuple[str, ...]    # scoped tensor names ("" for an omitted optional input)
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class ScopedGraph:
    scope: str                 # "" for the main graph
    parent: int | None         # walk index of the node owning it
    attribute: str             # "then_branch", "body", ... ("" for the main graph)
    graph: onnx.GraphProto
    names: dict[str, str] = field(default_factory=dict)  # local name -> scoped name (everything visible)

    def scoped(self, name: str) -> str:
        return self.names.get(name, name) if name else ""


@dataclass(frozen=True)
class Walk:
    nodes: tuple[ScopedNode, ...]
    graphs: tuple[ScopedGraph, ...]   # main graph first, then bodies in walk order


def subgraphs(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """The body graphs a node holds, as (attribute name, graph)."""
    found = []
    for attr in node.attribute:
        if attr.type == ATTR_GRAPH:
            found.append((attr.name, attr.g))
        elif attr.type == ATTR_GRAPHS:
            found += [(f"{attr.name}[{k}]", g) for k, g in enumerate(attr.graphs)]
    return found


def node_label(node: onnx.NodeProto, position: int) -> str:
    return node.name or f"{node.op_type}_{position}"


def walk(graph: onnx.GraphProto) -> Walk:
    nodes: list[ScopedNode] = []
    graphs: list[ScopedGraph] = []

    def visit(g: onnx.GraphProto, scope: str, visible: dict[str, str], parent: int | None, attribute: str) -> None:
        names = dict(visible)
        if scope:
            local = [v.name for v in g.input] + [t.name for t in g.initializer]
            local += [s.values.name for s in g.sparse_initializer]
            local += [o for n in g.node for o in n.output if o]
            names.update({name: scope + name for name in local})
        sg = ScopedGraph(scope, parent, attribute, g, names)
        graphs.append(sg)
        for position, node in enumerate(g.node):
            label = node_label(node, position)
            here = len(nodes)
            nodes.append(ScopedNode(here, scope + label, scope, parent, node,
                                    tuple(sg.scoped(n) for n in node.input),
                                    tuple(sg.scoped(n) for n in node.output)))
            for attr_name, body in subgraphs(node):
                visit(body, f"{scope}{label}/{attr_name}/", names, here, attr_name)

    visit(graph, "", {}, None, "")
    return Walk(tuple(nodes), tuple(graphs))
