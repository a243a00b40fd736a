"""Name-free view of an ONNX graph (see canonical.py; shared pieces in canon_base.py)."""

from __future__ import annotations

import json

import onnx
from onnx import helper, numpy_helper

from tiergate.artifact.canon_base import CanonGraph, CanonNode, digest, spec_text, values_text
from tiergate.artifact.onnx_loader import QUANT_SLOTS, dtype_name


def _quant_param_slots(op: str) -> set[int]:
    return {slot for triple in QUANT_SLOTS.get(op, ()) for slot in triple[1:]}


def tensor_bytes(tensor: onnx.TensorProto) -> bytes:
    if tensor.raw_data:
        return tensor.raw_data
    return numpy_helper.to_array(tensor).tobytes()


class _Weights:
    """Digests of initializers, each computed once."""

    def __init__(self, initializers):
        self.tensors = {t.name: t for t in initializers}
        self.digests: dict[str, str] = {}

    def digest(self, name: str) -> str:
        if name not in self.digests:
            self.digests[name] = digest(tensor_bytes(self.tensors[name]))
        return self.digests[name]


def canonical_onnx(graph: onnx.GraphProto, outer: dict[str, str] | None = None) -> CanonGraph:
    weights = _Weights(graph.initializer)
    refs = dict(outer or {})
    for t in graph.initializer:
        refs[t.name] = "c:" + spec_text(dtype_name(t.data_type), t.dims)
    inputs = [v for v in graph.input if v.name not in weights.tensors]
    for position, value in enumerate(inputs):
        refs[value.name] = f"in{position}"
    nodes = []
    for index, node in enumerate(graph.node):
        nodes.append(_node(index, node, refs, weights))
        for k, name in enumerate(node.output):
            if name:
                refs[name] = f"n{index}:{k}"
    unused = sorted(set(weights.tensors) - _used_names(graph))
    return CanonGraph(
        inputs=tuple(spec_text(dtype_name(v.type.tensor_type.elem_type), _dims(v)) for v in inputs),
        outputs=tuple(refs.get(v.name, "?") for v in graph.output),
        nodes=tuple(nodes),
        loose_weights=tuple(sorted(weights.digest(n) for n in unused)),
        loose_specs=tuple(sorted(refs[n] for n in unused)),
    )


def _used_names(graph: onnx.GraphProto) -> set[str]:
    used = {name for node in graph.node for name in node.input}
    return used | {v.name for v in graph.output}


def _dims(value: onnx.ValueInfoProto):
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def _node(index: int, node: onnx.NodeProto, refs: dict[str, str], weights: _Weights) -> CanonNode:
    quant_slots = _quant_param_slots(node.op_type)
    found_weights: dict[str, str] = {}
    found_quant: dict[str, str] = {}
    for slot, name in enumerate(node.input):
        if name not in weights.tensors:
            continue
        if slot in quant_slots:
            t = weights.tensors[name]
            found_quant[f"in{slot}"] = values_text(dtype_name(t.data_type), numpy_helper.to_array(t))
        else:
            found_weights[f"in{slot}"] = weights.digest(name)
    attrs = {}
    for attr in node.attribute:
        attrs[attr.name] = _attr_text(attr, refs, found_weights, found_quant)
    return CanonNode(
        index=index,
        op=node.op_type,
        domain=node.domain,
        name=node.name,
        attrs=attrs,
        inputs=tuple(refs.get(n, "?") if n else "" for n in node.input),
        weights=found_weights,
        quant=found_quant,
    )


def _attr_text(attr: onnx.AttributeProto, refs, found_weights: dict, found_quant: dict) -> str:
    value = helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        found_weights[f"attr:{attr.name}"] = digest(tensor_bytes(value))
        return "tensor:" + spec_text(dtype_name(value.data_type), value.dims)
    if isinstance(value, onnx.GraphProto):
        sub = canonical_onnx(value, {k: "outer:" + v for k, v in refs.items()})
        found_weights[f"attr:{attr.name}"] = digest(json.dumps(
            [sorted(n.weights.items()) for n in sub.nodes] + [list(sub.loose_weights)]).encode())
        if any(n.quant for n in sub.nodes):
            found_quant[f"attr:{attr.name}"] = digest(json.dumps([sorted(n.quant.items()) for n in sub.nodes]).encode())
        return "graph:" + digest(json.dumps([sub.inputs, sub.outputs, [n.structure_text() for n in sub.nodes]]).encode())
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, list):
        value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value
                 if not isinstance(v, (onnx.TensorProto, onnx.GraphProto))]
    return json.dumps(value)
