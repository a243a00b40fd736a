"""ONNX (protobuf, optionally with external data) into an Artifact."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from tiergate.artifact.external import load_external_data
from tiergate.artifact.model import Artifact, Node, QuantParams, TensorSpec
from tiergate.artifact.onnx_types import dtype_name, plain_value, sparse_names, tensor_elem, type_dims, type_text
from tiergate.artifact.onnx_walk import ScopedNode, Walk, walk
from tiergate.errors import InputError

__all__ = ["DYNAMIC_SLOTS", "QUANT_SLOTS", "dtype_name", "dynamic_scales", "load_onnx"]

# input slots holding (scale, zero point) pairs, by op: quantization parameters, not weights
QUANT_SLOTS: dict[str, tuple[tuple[int, int, int], ...]] = {
    # op: ((tensor slot or -1 for output 0, scale slot, zero-point slot), ...)
    "QuantizeLinear": ((-1, 1, 2),),
    "DequantizeLinear": ((0, 1, 2),),
    "QLinearConv": ((0, 1, 2), (3, 4, 5), (-1, 6, 7)),
    "QLinearMatMul": ((0, 1, 2), (3, 4, 5), (-1, 6, 7)),
    "QLinearAdd": ((0, 1, 2), (3, 4, 5), (-1, 6, 7)),
    "QLinearMul": ((0, 1, 2), (3, 4, 5), (-1, 6, 7)),
}


def load_onnx(path: Path, data: bytes, *, check: bool = True) -> Artifact:
    """check=False: skip the ONNX checker (a runtime's optimized graph, with its contrib ops)."""
    model = _parse(path, data)
    digest = hashlib.sha256(data)
    locations, external_bytes = load_external_data(path, model, digest)
    if check:
        _check(path, model.SerializeToString() if locations else data, model)
    graph = model.graph
    init_names = {t.name for t in graph.initializer} | set(sparse_names(graph))
    walked = walk(graph)
    return Artifact(
        path=path,
        format="onnx",
        sha256=digest.hexdigest(),
        size_bytes=len(data) + external_bytes,
        version=_version(model),
        inputs=[_spec(v) for v in graph.input if v.name not in init_names],
        outputs=[_spec(v) for v in graph.output],
        nodes=[_node(n) for n in walked.nodes],
        quant=_quant(walked),
        initializers={sg.scoped(t.name): (tuple(t.dims), dtype_name(t.data_type))
                      for sg in walked.graphs for t in sg.graph.initializer},
        metadata={p.key: p.value for p in model.metadata_props},
        tensor_dtypes=_dtypes(model, walked),
        external_data=locations,
        handle=model,
    )


def _parse(path: Path, data: bytes) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise InputError(f"{path}: ONNX file is truncated or corrupt (protobuf does not parse: {exc})") from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InputError(f"{path}: is not an ONNX model (no IR version or no graph)")
    return model


def _check(path: Path, serialized: bytes, model: onnx.ModelProto) -> None:
    """The ONNX checker, on bytes (a ModelProto would be serialised again, twice, inside it), its whole message on
    one line. Node order is the runtime's question (onnxruntime sorts a graph itself; onnxruntime's own float16
    converter writes its input Casts last): a graph the checker finds unsorted is sorted here (`model`, in place:
    the Artifact's nodes are in topological order), checked again, and taken when onnxruntime loads the file."""
    try:
        onnx.checker.check_model(serialized)
        return
    except (onnx.checker.ValidationError, ValueError) as exc:
        text = _one_line(exc)
    if "topologically sorted" not in text or not sort_nodes(model.graph):
        raise InputError(f"{path}: ONNX model is invalid or incomplete ({text})")
    try:
        onnx.checker.check_model(model.SerializeToString())
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise InputError(f"{path}: ONNX model is invalid or incomplete ({_one_line(exc)})") from None
    refusal = _runtime_refusal(serialized)
    if refusal:
        raise InputError(f"{path}: its nodes are not in topological order and onnxruntime does not load it "
                         f"({refusal})")


def _one_line(exc: BaseException, limit: int = 600) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sort_nodes(graph) -> bool:
    """The main graph's nodes in a topological order (stable: each node as early as its inputs allow, ties in file
    order), in place; False when there is none (a cycle, or an input nothing makes)."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | set(sparse_names(graph)) | {""}
    produced = {out for node in graph.node for out in node.output}
    pending, ordered = list(graph.node), []
    while pending:
        ready = next((n for n in pending if all(name in known or name not in produced for name in _needs(n))), None)
        if ready is None:
            return False
        pending.remove(ready)
        ordered.append(ready)
        known.update(ready.output)
    copies = [onnx.NodeProto() for _ in ordered]
    for copy, node in zip(copies, ordered):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
    return True


def _needs(node) -> set[str]:
    """A node's inputs, and the outer values its subgraphs read."""
    names = set(node.input)
    for attr in node.attribute:
        for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            names |= {name for n in body.node for name in n.input}
    return names


def _runtime_refusal(serialized: bytes) -> str:
    """onnxruntime's one line when it does not load the model (in this process, optimizations off), else ""."""
    import onnxruntime as ort

    from tiergate.ort_session import session

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session(serialized, options)
    except Exception as exc:  # noqa: BLE001 - the runtime's refusal, in its own words
        return _one_line(exc, 300)
    return ""


def _version(model: onnx.ModelProto) -> str:
    default = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return f"opset {default[0]}" if default else "opset ?"


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    """A graph input or output of any type: a tensor's element type, else the type's text (seq(float32),
    optional(...), map(...), sparse(...), or "?" when the value declares no type)."""
    return TensorSpec(value.name, type_dims(value.type), type_text(value.type))


def _node(scoped: ScopedNode) -> Node:
    node = scoped.node
    return Node(
        index=scoped.index,
        op=node.op_type,
        name=node.name,
        inputs=list(scoped.inputs),
        outputs=list(scoped.outputs),
        attributes={a.name: _attr_value(a) for a in node.attribute},
        domain=node.domain,
        path=scoped.path,
        scope=scoped.scope,
    )


def _attr_value(attr: onnx.AttributeProto):
    try:
        value = helper.get_attribute_value(attr)
    except ValueError:          # an attribute type this onnx does not know, or a reference to a function's
        return {"ref": attr.ref_attr_name} if attr.ref_attr_name else None
    return plain_value(value)


def _dtypes(model: onnx.ModelProto, walked: Walk) -> dict[str, str]:
    """Element types of every tensor (body graphs included, by scoped name): declared ones,
    initializers, then shape inference."""
    types: dict[str, str] = {}
    for sg in walked.graphs:
        g = sg.graph
        types.update({sg.scoped(t.name): dtype_name(t.data_type) for t in g.initializer})
        for value in [*g.input, *g.output, *g.value_info]:
            if tensor_elem(value.type):
                types[sg.scoped(value.name)] = tensor_elem(value.type)
    try:
        inferred = walk(onnx.shape_inference.infer_shapes(_skeleton(model)).graph).graphs
    except Exception:  # noqa: BLE001 - inference is a best effort; declared types remain
        inferred = ()
    for sg in inferred:
        for value in [*sg.graph.value_info, *sg.graph.output]:
            if tensor_elem(value.type):
                types.setdefault(sg.scoped(value.name), tensor_elem(value.type))
    return types


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without initializer data: type inference needs only names, types and dims."""
    skeleton = onnx.ModelProto()
    skeleton.ir_version = model.ir_version
    skeleton.opset_import.extend(model.opset_import)
    graph = skeleton.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    known = {v.name for v in graph.input}
    for t in model.graph.initializer:
        if t.name not in known:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return skeleton


# dynamic quantization (onnxruntime's quantize_dynamic): integer ops whose weights are quantized offline, by op:
# (weight slot, weight zero-point slot); their activations are quantized at run time by DynamicQuantizeLinear
DYNAMIC_SLOTS: dict[str, tuple[int, int]] = {"MatMulInteger": (1, 3), "ConvInteger": (1, 3)}


def dynamic_scales(walked: Walk) -> set[str]:
    """The scales a DynamicQuantizeLinear computes per call (its output 1): a Mul reading one multiplies it by a
    weight's scale (the dequantization of an integer op's result)."""
    return {scoped.outputs[1] for scoped in walked.nodes
            if scoped.node.op_type == "DynamicQuantizeLinear" and len(scoped.outputs) > 1 and scoped.outputs[1]}


def _quant(walked: Walk) -> dict[str, QuantParams]:
    """Scale and zero point of every tensor a Q/DQ or QLinear op (de)quantizes (scoped names); the weights of a
    dynamically quantized integer op (their scale from the Mul that dequantizes its result) and the activations
    DynamicQuantizeLinear quantizes at run time (no fixed scale: `scale` empty)."""
    inits = {sg.scoped(t.name): t for sg in walked.graphs for t in sg.graph.initializer}
    found: dict[str, QuantParams] = _dynamic(walked, inits)
    for scoped in walked.nodes:
        node = scoped.node
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        for tensor_slot, scale_slot, zp_slot in QUANT_SLOTS.get(node.op_type, ()):
            tensor = scoped.outputs[0] if tensor_slot < 0 else _at(scoped.inputs, tensor_slot)
            scale = inits.get(_at(scoped.inputs, scale_slot))
            if not tensor or scale is None or tensor in found:
                continue
            zero = inits.get(_at(scoped.inputs, zp_slot))
            found[tensor] = _params(tensor, scale, zero, axis)
    return found


def _dynamic(walked: Walk, inits: dict) -> dict[str, QuantParams]:
    from onnx import numpy_helper

    found: dict[str, QuantParams] = {}
    runtime_scales = dynamic_scales(walked)
    muls = {name: scoped for scoped in walked.nodes if scoped.node.op_type == "Mul" for name in scoped.outputs}
    weight_scale = {}            # the product of a run-time scale and an initializer: that initializer
    for name, scoped in muls.items():
        if any(i in runtime_scales for i in scoped.inputs):
            weight_scale[name] = next((inits[i] for i in scoped.inputs if i in inits), None)
    readers: dict[str, list] = {}
    for scoped in walked.nodes:
        for name in scoped.inputs:
            readers.setdefault(name, []).append(scoped)
        if scoped.node.op_type == "DynamicQuantizeLinear" and scoped.outputs and scoped.outputs[0]:
            found[scoped.outputs[0]] = QuantParams(scoped.outputs[0], (), (), "uint8")
    for scoped in walked.nodes:
        slots = DYNAMIC_SLOTS.get(scoped.node.op_type)
        weight = _at(scoped.inputs, slots[0]) if slots else ""
        if weight not in inits or weight in found:
            continue
        zero = inits.get(_at(scoped.inputs, slots[1]))
        scale = _scale_after(scoped, readers, weight_scale)
        zeros = tuple(int(z) for z in numpy_helper.to_array(zero).reshape(-1)) if zero is not None else (0,)
        scales = tuple(float(v) for v in numpy_helper.to_array(scale).reshape(-1)) if scale is not None else ()
        found[weight] = QuantParams(weight, scales, zeros, dtype_name(inits[weight].data_type),
                                    0 if len(scales) > 1 or len(zeros) > 1 else None)
    return found


def _scale_after(node, readers: dict, weight_scale: dict):
    """The weight scale multiplied into an integer op's result: through a Cast, the Mul by (run-time scale x
    weight scale)."""
    frontier = [node]
    for _ in range(3):
        following = []
        for scoped in frontier:
            for out in scoped.outputs:
                for reader in readers.get(out, []):
                    for name in reader.inputs:
                        if weight_scale.get(name) is not None:
                            return weight_scale[name]
                    if reader.node.op_type in ("Cast", "Mul"):
                        following.append(reader)
        frontier = following
    return None


def _params(tensor: str, scale: onnx.TensorProto, zero: onnx.TensorProto | None, axis: int | None) -> QuantParams:
    from onnx import numpy_helper

    scales = numpy_helper.to_array(scale).reshape(-1)
    zeros = numpy_helper.to_array(zero).reshape(-1) if zero is not None else None
    return QuantParams(
        tensor=tensor,
        scale=tuple(float(s) for s in scales),
        zero_point=tuple(int(z) for z in zeros) if zeros is not None else (0,) * len(scales),
        dtype=dtype_name(zero.data_type) if zero is not None else "uint8",
        axis=axis if len(scales) > 1 else None,
    )


def _at(names, slot: int) -> str:
    return names[slot] if slot < len(names) else ""
