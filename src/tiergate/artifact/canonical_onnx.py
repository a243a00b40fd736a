"""Name-free view of an ONNX graph (see canonical.py; shared pieces in canon_base.py)."""

from __future__ import annotations

import json

import onnx
from onnx import helper, numpy_helper

from tiergate.artifact.canon_base import CanonGraph, CanonNode, digest, spec_text, values_text
from tiergate.artifact.onnx_loader import DYNAMIC_SLOTS, QUANT_SLOTS, dynamic_scales
from tiergate.artifact.onnx_types import dtype_name, plain_value, type_dims, type_text
from tiergate.artifact.onnx_walk import ATTR_GRAPH, ATTR_GRAPHS, ScopedNode, Walk, walk


def _quant_param_slots(op: str) -> set[int]:
    """The input slots of an op that hold quantization parameters: scales and zero points (Q/DQ, QLinear*), an
    integer op's zero points (dynamic quantization)."""
    slots = {slot for triple in QUANT_SLOTS.get(op, ()) for slot in triple[1:]}
    if op in DYNAMIC_SLOTS:
        slots |= {2, DYNAMIC_SLOTS[op][1]}
    return slots


def tensor_bytes(tensor: onnx.TensorProto) -> bytes:
    """The bytes a weight digest is taken of: raw data, else the values (strings length-prefixed: an
    object array's bytes would be pointers)."""
    if tensor.raw_data:
        return tensor.raw_data
    if tensor.data_type == onnx.TensorProto.STRING:
        return b"".join(len(v).to_bytes(8, "little") + v for v in tensor.string_data)
    return numpy_helper.to_array(tensor).tobytes()


def sparse_bytes(sparse: onnx.SparseTensorProto) -> bytes:
    dims = ",".join(str(d) for d in sparse.dims).encode()
    return dims + b"|" + tensor_bytes(sparse.values) + b"|" + tensor_bytes(sparse.indices)


class _Weights:
    """Digests of initializers (every scope's, by scoped name), each computed once."""

    def __init__(self, tensors: dict[str, onnx.TensorProto | onnx.SparseTensorProto]):
        self.tensors = tensors  # by scoped name
        self.digests: dict[str, str] = {}

    def digest(self, name: str) -> str:
        if name not in self.digests:
            t = self.tensors[name]
            self.digests[name] = digest(sparse_bytes(t) if isinstance(t, onnx.SparseTensorProto) else tensor_bytes(t))
        return self.digests[name]


def canonical_onnx(graph: onnx.GraphProto) -> CanonGraph:
    """The whole model, body graphs (If/Loop/Scan) included: their nodes follow the node that
    holds them (onnx_walk's order), named by their path, with name-free references."""
    walked = walk(graph)
    tensors = {sg.scoped(t.name): t for sg in walked.graphs for t in sg.graph.initializer}
    tensors.update({sg.scoped(t.values.name): t for sg in walked.graphs for t in sg.graph.sparse_initializer})
    weights = _Weights(tensors)
    refs: dict[str, str] = {}
    for sg in walked.graphs:
        for t in sg.graph.initializer:
            refs[sg.scoped(t.name)] = "c:" + spec_text(dtype_name(t.data_type), t.dims)
        for t in sg.graph.sparse_initializer:
            refs[sg.scoped(t.values.name)] = "c:" + spec_text(f"sparse({dtype_name(t.values.data_type)})", t.dims)
    main = walked.graphs[0]
    constants = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    inputs = [v for v in graph.input if v.name not in constants]
    for position, value in enumerate(inputs):
        refs[value.name] = f"in{position}"
    for sg in walked.graphs[1:]:
        # a body's inputs, named by the node that holds the body (name-free)
        for position, value in enumerate(sg.graph.input):
            refs[sg.scoped(value.name)] = f"n{sg.parent}/{sg.attribute}/in{position}"
    for scoped in walked.nodes:
        for k, name in enumerate(scoped.outputs):
            if name:
                refs[name] = f"n{scoped.index}:{k}"
    bodies = {}
    for sg in walked.graphs[1:]:
        bodies.setdefault(sg.parent, {})[sg.attribute] = sg
    runtime_scales = dynamic_scales(walked)
    nodes = [_node(scoped, refs, weights, bodies.get(scoped.index, {}), runtime_scales) for scoped in walked.nodes]
    unused = sorted(set(weights.tensors) - _used_names(walked))
    return CanonGraph(
        inputs=tuple(spec_text(type_text(v.type), _dims(v)) for v in inputs),
        outputs=tuple(refs.get(main.scoped(v.name), "?") for v in graph.output),
        nodes=tuple(nodes),
        loose_weights=tuple(sorted(weights.digest(n) for n in unused)),
        loose_specs=tuple(sorted(refs[n] for n in unused)),
    )


def _used_names(walked: Walk) -> set[str]:
    used = {name for node in walked.nodes for name in node.inputs}
    return used | {sg.scoped(v.name) for sg in walked.graphs for v in sg.graph.output}


def _dims(value: onnx.ValueInfoProto):
    return list(type_dims(value.type, symbolic=False))


def _node(scoped: ScopedNode, refs: dict[str, str], weights: _Weights, bodies: dict,
          runtime_scales: frozenset | set = frozenset()) -> CanonNode:
    node = scoped.node
    quant_slots = _quant_param_slots(node.op_type)
    if node.op_type == "Mul" and any(name in runtime_scales for name in scoped.inputs):
        quant_slots = set(range(len(scoped.inputs)))     # a run-time scale times a weight's: quantization
    found_weights: dict[str, str] = {}
    found_quant: dict[str, str] = {}
    for slot, name in enumerate(scoped.inputs):
        if name not in weights.tensors:
            continue
        t = weights.tensors[name]
        if slot in quant_slots and isinstance(t, onnx.TensorProto):
            found_quant[f"in{slot}"] = values_text(dtype_name(t.data_type), numpy_helper.to_array(t))
        else:
            found_weights[f"in{slot}"] = weights.digest(name)
    attrs = {}
    for attr in node.attribute:
        attrs[attr.name] = _attr_text(attr, refs, found_weights, bodies)
    return CanonNode(
        index=scoped.index,
        op=node.op_type,
        domain=node.domain,
        name=scoped.path,
        attrs=attrs,
        inputs=tuple(refs.get(n, "?") if n else "" for n in scoped.inputs),
        weights=found_weights,
        quant=found_quant,
    )


def _attr_text(attr: onnx.AttributeProto, refs, found_weights: dict, bodies: dict) -> str:
    if attr.type in (ATTR_GRAPH, ATTR_GRAPHS):
        # the body's nodes are canonical nodes of their own; here only its interface
        names = [attr.name] if attr.type == ATTR_GRAPH else [f"{attr.name}[{k}]" for k in range(len(attr.graphs))]
        return json.dumps([_body_text(bodies[n], refs) for n in names if n in bodies])
    try:
        value = helper.get_attribute_value(attr)
    except ValueError:          # an attribute type this onnx does not know, or a function's reference
        return json.dumps({"ref": attr.ref_attr_name, "type": int(attr.type)})
    if isinstance(value, onnx.TensorProto):
        found_weights[f"attr:{attr.name}"] = digest(tensor_bytes(value))
        return "tensor:" + spec_text(dtype_name(value.data_type), value.dims)
    if isinstance(value, onnx.SparseTensorProto):
        found_weights[f"attr:{attr.name}"] = digest(sparse_bytes(value))
        return "tensor:" + spec_text(f"sparse({dtype_name(value.values.data_type)})", value.dims)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, list):
        for k, item in enumerate(value):
            if isinstance(item, (onnx.TensorProto, onnx.SparseTensorProto)):
                found_weights[f"attr:{attr.name}[{k}]"] = digest(
                    sparse_bytes(item) if isinstance(item, onnx.SparseTensorProto) else tensor_bytes(item))
        value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value
                 if not isinstance(v, (onnx.TensorProto, onnx.SparseTensorProto, onnx.GraphProto))]
    return json.dumps(plain_value(value))


def _body_text(sg, refs: dict[str, str]) -> str:
    g = sg.graph
    ins = [spec_text(type_text(v.type), _dims(v)) for v in g.input]
    outs = [refs.get(sg.scoped(v.name), "?") for v in g.output]
    return f"graph:in={ins} out={outs}"
