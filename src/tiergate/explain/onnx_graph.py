"""The vocabulary of ONNX pairing: one graph's index (`Graph`: producers, readers, constants, activations, constant
values), the ops' families and quantized forms, the quantizers' naming conventions, how integers read as floats
(`QParams`, `dequantize`) and whether two weights are one layer's (`same_weights`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tiergate.explain.pairs import QDQ_OPS

RESHAPES = {"Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}
# ops whose output describes its input instead of computing on it
METADATA = {"Shape", "Size"}
# ops a candidate can hold inside the kernel of the node before (quant_pre_process folds BatchNormalization and a
# constant Add or Mul into a Conv, an Add into a MatMul; quantize_static absorbs a Relu or Clip into the output's
# quantization), each with its activation as the only non-constant input
ABSORBABLE = {"BatchNormalization", "Relu", "Clip", "Add", "Mul", "Identity", "Dropout"}
# the kind of computation, whatever the quantization: an op's family
FAMILY = {"QLinearConv": "Conv", "ConvInteger": "Conv", "FusedConv": "Conv", "NhwcFusedConv": "Conv",
          "Gemm": "MatMul", "QGemm": "MatMul", "FusedGemm": "MatMul", "QLinearMatMul": "MatMul",
          "MatMulInteger": "MatMul", "FusedMatMul": "MatMul", "DynamicQuantizeMatMul": "MatMul",
          "MatMulIntegerToFloat": "MatMul", "QLinearAdd": "Add", "QLinearMul": "Mul",
          "QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearAveragePool": "AveragePool",
          "QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu", "QLinearSoftmax": "Softmax",
          "QLinearConcat": "Concat", "QLinearReduceMean": "ReduceMean", "QLinearWhere": "Where",
          "Flatten": "Reshape", "Squeeze": "Reshape", "Unsqueeze": "Reshape", "Dropout": "Identity"}
# QLinear ops: their data inputs as (tensor, scale, zero point) positions, and their output's (scale, zero point)
QLINEAR = {"QLinearConv": ([(0, 1, 2)], (6, 7)), "QGemm": ([(0, 1, 2), (3, 4, 5)], (7, 8)),
           "QLinearMatMul": ([(0, 1, 2), (3, 4, 5)], (6, 7)), "QLinearAdd": ([(0, 1, 2), (3, 4, 5)], (6, 7)),
           "QLinearMul": ([(0, 1, 2), (3, 4, 5)], (6, 7)), "QLinearGlobalAveragePool": ([(0, 1, 2)], (3, 4)),
           "QLinearAveragePool": ([(0, 1, 2)], (3, 4)), "QLinearSigmoid": ([(0, 1, 2)], (3, 4)),
           "QLinearLeakyRelu": ([(0, 1, 2)], (3, 4)), "QLinearSoftmax": ([(0, 1, 2)], (3, 4)),
           "QLinearReduceMean": ([(0, 1, 2)], (3, 4))}
# ops QOperator runs directly on integer tensors: the output keeps the input's scale and zero point
INTEGER_PASS = {"Transpose", "MaxPool", "Resize", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Gather", "Slice",
                "Split", "Pad", "SpaceToDepth", "DepthToSpace", "Identity", "Concat", "Tile", "Expand"}
# the quantizers' names for a tensor T they quantize or dequantize (onnxruntime's QDQ and QOperator formats)
CONVENTIONS = ("_QuantizeLinear_Output", "_QuantizeLinear_Input", "_DequantizeLinear_Output", "_quantized")
SAME_WEIGHTS = 0.9           # median per-channel |cosine| of two weights that are the same layer's


def family(op: str) -> str:
    return FAMILY.get(op, op)


def convention(name: str) -> str:
    """The tensor T a quantizer-made name stands for ("" when it follows no convention)."""
    for suffix in CONVENTIONS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return ""


@dataclass
class QParams:
    """How an integer tensor reads as floats: (q - zero_point) * scale, per tensor or per index of `axis`."""

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str
    axis: int = 1


@dataclass
class Meaning:
    fp32: str                        # the FP32 tensor whose values it holds
    how: str                         # the evidence: name, convention, structure, input, reshape
    q: QParams | None = None         # an integer tensor: how it reads as floats
    reads: str = ""                  # a DequantizeLinear output: the integer tensor it reads ...
    reads_q: QParams | None = None   # ... with these
    opaque: bool = False             # integers whose scale is known only at run time (dynamic quantization)


class Graph:
    """One graph's index: producers, readers, what is constant, metadata or an activation, constant values."""

    def __init__(self, graph):
        self.nodes = list(graph.node)
        self.init = {t.name: t for t in graph.initializer}
        self.inputs = [i.name for i in graph.input if i.name not in self.init]
        self.outputs = [o.name for o in graph.output]
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        self.const, self.meta, self.act = set(self.init), set(), set(self.inputs)
        self._values: dict[str, np.ndarray | None] = {}
        for k, node in enumerate(self.nodes):
            ins = [i for i in node.input if i]
            outs = [o for o in node.output if o]
            for o in outs:
                self.producer[o] = k
            for i in dict.fromkeys(ins):
                self.readers.setdefault(i, []).append(k)
            if node.op_type == "Constant" or (ins and all(i in self.const for i in ins) and not has_subgraph(node)):
                self.const.update(outs)
            elif node.op_type in METADATA or not any(i in self.act for i in ins):
                self.meta.update(outs)
            elif node.op_type == "DynamicQuantizeLinear":
                self.act.update(outs[:1])
                self.meta.update(outs[1:])
            else:
                self.act.update(outs)

    def act_inputs(self, node) -> list[str]:
        return [i for i in node.input if i and i in self.act]

    def value(self, name: str) -> np.ndarray | None:
        """A constant's value: an initializer, a Constant node's, a DequantizeLinear of a constant (dequantized)."""
        if name not in self._values:
            self._values[name] = self._value(name)
        return self._values[name]

    def _value(self, name: str) -> np.ndarray | None:
        from onnx import helper, numpy_helper

        if name in self.init:
            return numpy_helper.to_array(self.init[name])
        k = self.producer.get(name)
        if k is None or name not in self.const:
            return None
        node = self.nodes[k]
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
                if attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
                    return np.array(helper.get_attribute_value(attr))
            return None
        if node.op_type in ("Identity", "Dropout"):
            return self.value(node.input[0])
        if node.op_type == "DequantizeLinear":
            q, scale = self.value(node.input[0]), self.value(node.input[1])
            zp = self.value(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            if q is None or scale is None or q.dtype.kind not in "iu":
                return None
            return dequantize(q, QParams(scale.reshape(-1), np.zeros(1) if zp is None else zp.reshape(-1),
                                         q.dtype.name, node_axis(node)))
        return None


def has_subgraph(node) -> bool:
    from onnx import AttributeProto

    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def node_axis(node, default: int = 1) -> int:
    for attr in node.attribute:
        if attr.name == "axis":
            return int(attr.i)
    return default


def dequantize(q: np.ndarray, params: QParams) -> np.ndarray:
    """(q - zero_point) * scale as float64, per tensor or along params.axis of q."""
    values = q.astype(np.float64)
    if params.scale.size == 1:
        return (values - float(params.zero_point.reshape(-1)[0])) * float(params.scale.reshape(-1)[0])
    axis = params.axis % q.ndim
    shape = [1] * q.ndim
    shape[axis] = -1
    return (values - params.zero_point.astype(np.float64).reshape(shape)) * params.scale.reshape(shape)


def same_weights(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two weights are one layer's: equal shapes (or one the other transposed) and, along some axis, a median
    |cosine| per slice of at least SAME_WEIGHTS (quantization noise keeps it near 1; a folded BatchNormalization
    or Mul scales output channels, which a per-channel cosine does not see; other layers' weights are far off)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    if a.shape != b.shape:
        if a.ndim == 2 and a.shape == b.shape[::-1]:
            a = a.T
        else:
            return False

    def agree(x, y) -> bool:
        for axis in range(x.ndim):
            xs = np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)
            ys = np.moveaxis(y, axis, 0).reshape(y.shape[axis], -1)
            nx, ny = np.linalg.norm(xs, axis=1), np.linalg.norm(ys, axis=1)
            keep = (nx > 0) & (ny > 0)
            if keep.any() and np.median(np.abs((xs * ys).sum(axis=1))[keep] / (nx * ny)[keep]) >= SAME_WEIGHTS:
                return True
        return False

    return agree(a, b) or (a.ndim == 2 and a.shape[0] == a.shape[1] and agree(a.T, b))


def name_score(cand: str, ref: str) -> int:
    if not ref or not cand:
        return 0
    if cand == ref:
        return 2
    return 1 if cand.startswith(ref) and cand[len(ref)] in "_/:." else 0


def qparams(graph: Graph, scale_name: str, zp_name: str, axis: int) -> QParams | None:
    """How a scale and a zero point (constants of `graph`) read integers as floats; None without the scale."""
    scale = graph.value(scale_name) if scale_name else None
    if scale is None:
        return None
    zp = graph.value(zp_name) if zp_name else None
    if zp is None:
        zp = np.zeros(scale.shape, np.uint8)
    return QParams(scale.astype(np.float64).reshape(-1), zp.reshape(-1), zp.dtype.name, axis)


def data_inputs(graph: Graph, node) -> list[str]:
    """The activations a node computes on (a QLinear op's data inputs, not its scales and weights)."""
    if node.op_type == "QLinearConcat":
        positions = range(2, len(node.input), 3)
    elif node.op_type in QLINEAR:
        positions = [x for x, _, _ in QLINEAR[node.op_type][0]]
    else:
        positions = range(len(node.input))
    return [node.input[p] for p in positions if p < len(node.input) and node.input[p] in graph.act]


def largest_weight(graph: Graph, node) -> np.ndarray | None:
    """A node's weight: its largest constant input of two or more dimensions."""
    arrays = [graph.value(i) for i in node.input if i and i in graph.const]
    arrays = [a for a in arrays if a is not None and a.ndim >= 2 and a.dtype.kind == "f"]
    return max(arrays, key=lambda a: a.size) if arrays else None


def readers_through_qdq(graph: Graph, tensor: str) -> list:
    """The nodes that read `tensor`, directly or through Quantize/DequantizeLinear nodes (those passed through,
    not returned), each once, in the order they are reached."""
    found, todo, seen = [], [tensor], {tensor}
    while todo:
        for j in graph.readers.get(todo.pop(), []):
            node = graph.nodes[j]
            if node.op_type in QDQ_OPS:
                todo += [o for o in node.output if o and o not in seen]
                seen.update(node.output)
            else:
                found.append(node)
    return found
