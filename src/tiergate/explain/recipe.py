"""The candidate's own recipe: what a quantized ONNX candidate shows of how it was made (`quantized_nodes`: which of
its nodes run on integers), and the FP32 reference
prepared the way it was before quantizing, so that explain's fixes (orchestrator/explain_ab.py's `requantize`) are
made as the user made the candidate and differ from it only where they mean to (a calibration, nodes in float).

What is read (`settings`): the format (QDQ or QOperator), activation and weight types, per-channel weights,
reduce_range (weights within 7 bits), symmetric activations and weights (every zero point at the type's middle),
whether it was made after onnxruntime's `quant_pre_process` (the metadata that step leaves, else BatchNormalizations
the candidate folded), its opset, whether its weights were quantized offline (integer initializers behind a
DequantizeLinear) or at run time (a QuantizeLinear of a float constant), the op types it quantized (those that are
float wherever the candidate has them are left out: onnxruntime quantizes every type it knows by default, so the
list is passed on only when some type was left out) and the nodes it kept in float among those types.

`prepared(reference, settings, out)` is the reference as it was quantized: at the candidate's opset, pre-processed
when the candidate was, its Constant nodes made initializers when the candidate's weights were quantized offline
(onnxruntime's quantizer quantizes only initializers offline: a weight held by a Constant node gets a QuantizeLinear
run at every call, a bigger and slower model), every node named (`nodes_to_exclude` takes names).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tiergate.errors import InputError
from tiergate.explain.pairs import QDQ_OPS

_INTEGER_OPS = ("ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulNBits")
# onnxruntime's QOperator ops, by the float op they stand for
QOPERATOR = {"QLinearConv": "Conv", "QLinearMatMul": "MatMul", "QGemm": "Gemm", "QLinearAdd": "Add",
             "QLinearMul": "Mul", "QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu",
             "QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearAveragePool": "AveragePool",
             "QLinearConcat": "Concat", "QLinearSoftmax": "Softmax", "QLinearWhere": "Where",
             "QAttention": "Attention", "ConvInteger": "Conv", "MatMulInteger": "MatMul",
             "DynamicQuantizeMatMul": "MatMul", "MatMulIntegerToFloat": "MatMul"}
PRE_PROCESS_KEY = "onnx.quant.pre_process"        # what onnxruntime's quant_pre_process leaves in the metadata


def opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def quantized_nodes(graph) -> set[str]:
    """Names of the candidate's compute nodes that run on integers: an integer op (QLinear*, ConvInteger, ...),
    or a node all of whose non-constant inputs are dequantized and that either reads a quantized weight (a
    DequantizeLinear of a constant) or has its output quantized again (DQ -> op -> Q, what runtimes fuse).
    A float node that merely reads a dequantized tensor is not one: keeping it in float changes nothing."""
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant"
                                                       for o in n.output}
    made_by = {out: n for n in graph.node for out in n.output}
    quantizes = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear" and n.input}
    found = set()
    for node in graph.node:
        if not node.name or node.op_type in QDQ_OPS:
            continue
        if node.op_type.startswith("QLinear") or node.op_type == "QGemm" or node.op_type in _INTEGER_OPS:
            found.add(node.name)
            continue
        sources = [made_by.get(name) for name in node.input if name and name not in constants]
        if not sources or not all(src is not None and src.op_type == "DequantizeLinear" for src in sources):
            continue
        weights = any(src is not None and src.op_type == "DequantizeLinear" and src.input[0] in constants
                      for src in (made_by.get(name) for name in node.input if name))
        if weights or any(out in quantizes for out in node.output):
            found.add(node.name)
    return found


def settings(path: Path, reference: Path | None = None) -> dict:
    """The quantization settings a QDQ or QOperator ONNX candidate shows (module docstring)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    name_nodes(graph)
    inits = {t.name: t for t in graph.initializer}
    constants = set(inits) | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    ops = {n.op_type for n in graph.node}
    qlinear = any(op in QOPERATOR for op in ops)
    if not (ops & set(QDQ_OPS)) and not qlinear:
        raise InputError(f"{path}: the candidate is not quantized (no QuantizeLinear, DequantizeLinear or QLinear "
                         "op): there are no settings to re-quantize with")
    act, weight, per_channel, reduce_range = "uint8", "int8", False, False
    act_zero_points, weight_zero_points = [], []
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in constants and len(node.input) > 2 \
                and node.input[2] in inits:
            zero_point = numpy_helper.to_array(inits[node.input[2]])
            act = zero_point.dtype.name
            act_zero_points += [int(v) for v in zero_point.ravel()]
    weights: dict[str, list] = {}        # by integer type: [(values, scale size, zero points)]
    for node in graph.node:
        if node.op_type == "DequantizeLinear":           # QDQ: (weight, scale, zero point) at 0, 1, 2
            where = (0, 1, 2)
        elif node.op_type in ("QLinearConv", "QLinearMatMul", "QGemm"):     # QOperator: at 3, 4, 5
            where = (3, 4, 5)
        else:
            continue
        if len(node.input) <= where[1] or node.input[where[0]] not in inits or node.input[where[1]] not in inits:
            continue
        w = numpy_helper.to_array(inits[node.input[where[0]]])
        if w.dtype.name not in ("int8", "uint8") or w.ndim < 2:
            continue                                    # biases are int32
        zp = node.input[where[2]] if len(node.input) > where[2] else ""
        zero_points = numpy_helper.to_array(inits[zp]).ravel() if zp in inits else np.zeros(1, w.dtype)
        weights.setdefault(w.dtype.name, []).append((w, numpy_helper.to_array(inits[node.input[where[1]]]).size,
                                                     zero_points))
    if weights:        # the weights' type is the most common one (onnxruntime quantizes a few, such as a
        weight = max(weights, key=lambda k: len(weights[k]))   # ConvTranspose's, as activations)
        per_channel = any(size > 1 for _, size, _ in weights[weight])
        reduce_range = weight == "int8" and all(w.min() >= -64 and w.max() <= 63 for w, _, _ in weights[weight])
        weight_zero_points = [int(v) for _, _, zps in weights[weight] for v in zps]
    at_run_time = sum(1 for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] in constants)
    quantized = quantized_nodes(graph)
    types = {QOPERATOR.get(n.op_type, n.op_type) for n in graph.node if n.name in quantized or n.op_type in QOPERATOR}
    floats = [n for n in graph.node if n.op_type not in QDQ_OPS and n.op_type not in QOPERATOR
              and n.op_type != "Constant" and n.name not in quantized]
    meta = {p.key: p.value for p in model.metadata_props}
    pre_process = PRE_PROCESS_KEY in meta
    ref_ops: set[str] = set()
    if reference is not None:
        ref = onnx.load(str(reference))
        ref_ops = {n.op_type for n in ref.graph.node}
        bn = sum(n.op_type == "BatchNormalization" for n in ref.graph.node)
        # no metadata (another tool dropped it): BatchNormalizations folded away are the sign
        pre_process = pre_process or bn > sum(n.op_type == "BatchNormalization" for n in graph.node)
    middle = {"int8": 0, "uint8": 128}
    return {"format": "QOperator" if qlinear else "QDQ",      # a QOperator model quantizes its inputs too
            "activation_type": act, "weight_type": weight, "per_channel": per_channel,
            "reduce_range": reduce_range, "pre_process": pre_process, "opset": opset(model),
            "weights": "at run time" if at_run_time and not weight_zero_points else "offline",
            # None: too few zero points to tell by (onnxruntime's defaults then)
            "activation_symmetric": _all_at(act_zero_points, middle[act]),
            "weight_symmetric": _all_at(weight_zero_points, middle[weight]),
            "float_op_types": sorted({n.op_type for n in floats} - types),
            "float_nodes": sorted(n.name for n in floats if n.name and n.op_type in types),
            "op_types": sorted((ref_ops - {n.op_type for n in floats} - set(QDQ_OPS) - {"Constant"}) | types)}


def _all_at(zero_points: list[int], middle: int, enough: int = 3) -> bool | None:
    """Every zero point at the type's middle (symmetric), or None when there are too few to tell by."""
    return all(z == middle for z in zero_points) if len(zero_points) >= enough else None


def prepared(reference: Path, recipe: dict, out: Path) -> Path:
    """The reference as the candidate was quantized from (module docstring), written to `out`."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(reference))
    if recipe.get("opset", 0) > opset(model):
        try:
            model = version_converter.convert_version(model, recipe["opset"])
        except Exception as exc:  # noqa: BLE001 - onnx's converter, in its own words
            raise InputError(f"{reference}: cannot be converted to the candidate's opset {recipe['opset']} "
                             f"({' '.join(str(exc).split())[:200]})") from None
    onnx.save(model, str(out))
    if recipe.get("pre_process"):
        from onnxruntime.quantization.shape_inference import quant_pre_process

        quant_pre_process(str(out), str(out), skip_symbolic_shape=True)
        model = onnx.load(str(out))
    if recipe.get("weights") != "at run time":
        constants_to_initializers(model.graph)
    name_nodes(model.graph)
    onnx.save(model, str(out))
    return out


def constants_to_initializers(graph) -> int:
    """Every Constant node holding a tensor (`value`) made an initializer of the same name; returns how many."""
    moved = 0
    for node in list(graph.node):
        if node.op_type != "Constant" or len(node.attribute) != 1 or node.attribute[0].name != "value":
            continue
        tensor = node.attribute[0].t
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)
        moved += 1
    return moved


def name_nodes(graph) -> None:
    """Every unnamed node named by its op type and first output (`Gemm:r`), unique in the graph: what the pairing
    and the quantizer's nodes_to_exclude both use, so that a layer of an exporter's unnamed graph can be kept in
    float. Named nodes keep their names."""
    taken = {n.name for n in graph.node if n.name}
    for node in graph.node:
        if node.name:
            continue
        base = f"{node.op_type}:{node.output[0] if node.output else ''}"
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}#{k}"
        node.name = name
        taken.add(name)
