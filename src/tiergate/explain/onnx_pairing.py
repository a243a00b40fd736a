"""ONNX pairing: which tensor of the candidate holds what a tensor of the FP32 reference holds, whatever the two
graphs call them, and why the rest stays unpaired.

The candidate is walked from its inputs in topological order; each of its tensors gets a meaning (the FP32 tensor
whose values it holds, and, for an integer tensor, the scale and zero point that read it as floats), on this
evidence, strongest first:

1. the same name in both graphs (quantize_static keeps the FP32 names of what it computes; a Gemm into which a
   Relu was absorbed writes the Relu's output name, `r`);
2. the quantizers' naming conventions (`T_QuantizeLinear_Input` / `_Output`, `T_DequantizeLinear_Output`,
   QOperator's `T_quantized`): the tensor stands for T;
3. structure: a QuantizeLinear of a tensor holds that tensor in integers and a DequantizeLinear gives it back; a
   compute node pairs with the FP32 node of the same kind (Gemm, MatMul and QGemm alike, Conv and QLinearConv,
   every QLinear* op and its float op) that reads the same FP32 tensors (reshapes and Identity see through),
   ties broken by node name and by the weights themselves (dequantized, compared per output channel, sign-free:
   a folded BatchNormalization scales them); what follows that FP32 node and is absorbed into the candidate's
   kernel (BatchNormalization, a constant Add or Mul folded by quant_pre_process, a Relu or Clip absorbed into
   the output quantization) is followed to the FP32 tensor the candidate's output really holds, as long as the
   candidate does not compute that op itself. QLinear* outputs are integers read with the op's own output scale
   and zero point; the ops that QOperator runs directly on integers (MaxPool, Reshape, Transpose, ...) keep their
   input's.

For each FP32 tensor one candidate tensor is dumped, chosen to keep the candidate's integer kernels fused: one of
the candidate's outputs as it is, else an integer tensor that a DequantizeLinear reads (dequantized with that DequantizeLinear's scale and zero point: the
exact value its consumer reads), else an integer tensor with its own scale (a QLinear* output), else a float
tensor that is no DequantizeLinear output. Exposing DequantizeLinear outputs instead would stop onnxruntime from
fusing DQ -> op -> Q into one integer kernel, and a tier's integer-kernel saturation would vanish from the
evidence. The reference exposes only the tensors paired (and its outputs).

What stays unpaired is said, with a reason per tensor: FP32 tensors the candidate never holds (fused into one of
its kernels, computed by no candidate node, after an unpaired tensor) and candidate tensors that stand for no
FP32 tensor. Tensors computed inside subgraphs (If/Loop/Scan bodies) cannot be graph outputs: an If whose condition
the evaluation data fix is first replaced by the branch they take (specialize.py, in both models); what stays inside
a subgraph is listed as skipped, with the reason. Node names in the plan are the candidate's own (`nodes`) (a
specialized model's: an inlined node keeps its name), with their FP32 counterparts beside them (`fp32_nodes`, what
quantize_static's nodes_to_exclude takes when the reference is quantized again).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tiergate.errors import InputError
from tiergate.explain.pairs import QDQ_OPS, Plan, Source
from tiergate.explain.recipe import name_nodes, quantized_nodes

# ops whose output holds its input's values in another shape: transparent to the structure
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
            if node.op_type == "Constant" or (ins and all(i in self.const for i in ins) and not _has_subgraph(node)):
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
                                         q.dtype.name, _axis(node)))
        return None


def _has_subgraph(node) -> bool:
    from onnx import AttributeProto

    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def _axis(node, default: int = 1) -> int:
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


def _name_score(cand: str, ref: str) -> int:
    if not ref or not cand:
        return 0
    if cand == ref:
        return 2
    return 1 if cand.startswith(ref) and cand[len(ref)] in "_/:." else 0


class Pairing:
    """The candidate graph walked against the reference: the meaning of each candidate tensor, which FP32 node each
    candidate node computes, and why what stays unpaired does."""

    def __init__(self, cg, rg):
        self.c, self.r = Graph(cg), Graph(rg)
        self.meaning: dict[str, Meaning] = {}
        self.why: dict[str, str] = {}              # candidate tensor -> why it stands for no FP32 tensor
        self.twin: dict[int, int] = {}             # candidate node -> the FP32 node it computes
        self.cand_of: dict[int, int] = {}          # FP32 node (its twin or an op absorbed into it) -> candidate node
        self.fused: dict[str, tuple[int, str]] = {}   # FP32 tensor -> (candidate node, the FP32 tensor it holds)
        self.rejected: dict[int, str] = {}         # candidate node -> why no FP32 node of its kind is its twin
        self.ref_rejected: dict[int, str] = {}     # FP32 node -> a candidate node of its kind with other weights
        self._root: dict[str, str] = {}
        self._by_root: dict[str, list[int]] = {}
        for k, node in enumerate(self.r.nodes):
            for name in dict.fromkeys(self.r.act_inputs(node)):
                self._by_root.setdefault(self.root(name), []).append(k)
        for name in self.c.inputs:
            if name in self.r.inputs:
                self.meaning[name] = Meaning(name, "input")
            else:
                self.why[name] = "a model input the FP32 reference does not have"
        for k, node in enumerate(self.c.nodes):
            if not any(o in self.c.act for o in node.output if o):
                continue                           # constants (weights, their DequantizeLinear) and shapes
            if node.op_type == "QuantizeLinear":
                self._quantize(node)
            elif node.op_type == "DequantizeLinear":
                self._dequantize(node)
            elif node.op_type == "DynamicQuantizeLinear":
                self._dynamic(node)
            else:
                self._compute(k, node)

    # --- the reference ------------------------------------------------------------------------------------

    def root(self, name: str) -> str:
        """The FP32 tensor whose values `name` holds in another shape (through reshapes and Identity)."""
        if name not in self._root:
            k = self.r.producer.get(name)
            node = self.r.nodes[k] if k is not None else None
            ins = self.r.act_inputs(node) if node is not None else []
            self._root[name] = self.root(ins[0]) if node is not None and node.op_type in RESHAPES and len(ins) == 1 \
                else name
        return self._root[name]

    def ref_op(self, name: str) -> tuple[str, int]:
        k = self.r.producer.get(name)
        return ("input", -1) if k is None else (self.r.nodes[k].op_type, k)

    # --- the candidate, node by node ------------------------------------------------------------------------

    def _qparams(self, scale_name: str, zp_name: str, axis: int) -> QParams | None:
        scale = self.c.value(scale_name) if scale_name else None
        if scale is None:
            return None
        zp = self.c.value(zp_name) if zp_name else None
        if zp is None:
            zp = np.zeros(scale.shape, np.uint8)
        return QParams(scale.astype(np.float64).reshape(-1), zp.reshape(-1), zp.dtype.name, axis)

    def _qdq_source(self, node, verb: str):
        """A QuantizeLinear's or DequantizeLinear's input meaning and its node's parameters; (None, None), with
        the reason recorded, when the input stands for no FP32 tensor."""
        src = self.meaning.get(node.input[0])
        if src is None:
            self.why[node.output[0]] = f"{verb} {node.input[0]}, which stands for no FP32 tensor"
            return None, None
        return src, self._qparams(node.input[1], node.input[2] if len(node.input) > 2 else "", _axis(node))

    def _quantize(self, node) -> None:
        src, q = self._qdq_source(node, "quantizes")
        if src is not None:
            self.meaning[node.output[0]] = replace(src, q=q, reads="", reads_q=None, opaque=src.opaque or q is None)

    def _dequantize(self, node) -> None:
        src, params = self._qdq_source(node, "dequantizes")
        if src is not None:
            self.meaning[node.output[0]] = replace(src, q=None, reads=node.input[0], reads_q=params or src.q,
                                                   opaque=src.opaque or (params or src.q) is None)

    def _dynamic(self, node) -> None:
        src = self.meaning.get(node.input[0])
        if src is not None:
            self.meaning[node.output[0]] = replace(src, q=None, reads="", reads_q=None, opaque=True)

    def data_inputs(self, node) -> list[str]:
        """The activations a node computes on (a QLinear op's data inputs, not its scales and weights)."""
        if node.op_type == "QLinearConcat":
            positions = range(2, len(node.input), 3)
        elif node.op_type in QLINEAR:
            positions = [x for x, _, _ in QLINEAR[node.op_type][0]]
        else:
            positions = range(len(node.input))
        return [node.input[p] for p in positions if p < len(node.input) and node.input[p] in self.c.act]

    def _out_params(self, node) -> QParams | None:
        if node.op_type == "QLinearConcat":
            s, z = 0, 1
        else:
            s, z = QLINEAR[node.op_type][1]
        if len(node.input) <= s or not node.input[s]:
            return None                             # QGemm without an output scale: a float output
        return self._qparams(node.input[s], node.input[z] if len(node.input) > z else "", 1)

    def _compute(self, k: int, node) -> None:
        outs = [(i, o) for i, o in enumerate(node.output) if o and o in self.c.act]
        data = self.data_inputs(node)
        missing = [d for d in data if d not in self.meaning]
        metas = [self.meaning[d] for d in data if d in self.meaning]
        twin = self._find_twin(k, node, [m.fp32 for m in metas]) if data and not missing else None
        q_out, integer = None, node.op_type in QLINEAR or node.op_type == "QLinearConcat"
        ints = [m for m in metas if m.q is not None or m.opaque]
        if integer:
            q_out = self._out_params(node)
        elif ints and node.op_type in INTEGER_PASS and not ints[0].opaque:
            q_out, integer = ints[0].q, True
        for i, out in outs:
            if ints and not integer:                           # integers out, with no scale to read them
                what = "integers quantized at run time" if any(m.opaque for m in ints) else "integers"
                self.why[out] = f"{node.op_type} computes on {what} ({data[0]}) with no scale of its own"
                continue
            if out in self.r.act:                              # (1) the same name
                chain = self._chain_to(twin.output[i], out) if twin is not None and i < len(twin.output) else []
                self._hold(k, out, Meaning(out, "name", q=q_out if integer else None), chain)
                continue
            if missing:
                self.why[out] = f"computed from {missing[0]}, which stands for no FP32 tensor"
                continue
            base = convention(out)
            start = twin.output[i] if twin is not None and i < len(twin.output) and twin.output[i] else ""
            if base and base in self.r.act:                    # (2) the quantizer's naming
                end, chain = self._extend(base, out)
                self._hold(k, out, Meaning(end, "convention", q=q_out), self._chain_to(start, base) + chain)
            elif start:                                        # (3) the structure
                end, chain = self._extend(start, out)
                self._hold(k, out, Meaning(end, "structure", q=q_out), chain)
            elif node.op_type in RESHAPES and len(data) == 1:  # a reshape the reference does not have
                self.meaning[out] = replace(metas[0], how="reshape", reads="", reads_q=None,
                                            q=metas[0].q if integer else None)
            else:
                self.why[out] = self.rejected.get(k) or (
                    f"no FP32 {family(node.op_type)} reads what it reads ({', '.join(m.fp32 for m in metas)})"
                    if metas else f"{node.op_type} reads no activation")

    def _hold(self, k: int, out: str, meaning: Meaning, chain: list[int]) -> None:
        """`out` of candidate node k holds meaning.fp32; the FP32 nodes of `chain` are computed inside node k."""
        self.meaning[out] = meaning
        twin = self.twin.get(k)
        tensors = ([self.r.nodes[twin].output[0]] if twin is not None and chain else []) + \
                  [self.r.nodes[j].output[0] for j in chain]
        for j in chain:
            self.cand_of.setdefault(j, k)
        for name in tensors:
            if name != meaning.fp32:
                self.fused.setdefault(name, (k, meaning.fp32))

    def _find_twin(self, k: int, node, refs: list[str]):
        """The FP32 node candidate node k computes: of its family, reading the same FP32 tensors; ties broken by
        name and by weights (a node whose weights are another layer's is none)."""
        fam, roots = family(node.op_type), Counter(self.root(t) for t in refs)
        options, seen = [], set()
        for t in roots:
            for j in self._by_root.get(t, []):
                if j in seen or j in self.cand_of:
                    continue
                seen.add(j)
                other = self.r.nodes[j]
                if family(other.op_type) == fam and Counter(self.root(i) for i in self.r.act_inputs(other)) == roots:
                    options.append(j)
        agreeing = [j for j in options if self._weights_agree(node, self.r.nodes[j]) is not False]
        if options and not agreeing:
            self.rejected[k] = (f"its weights are not those of the FP32 {fam} reading "
                                f"{', '.join(sorted(roots))} ({', '.join(self.r.nodes[j].name for j in options)})")
            for j in options:
                self.ref_rejected.setdefault(j, node.name or node.op_type)
        if not agreeing:
            return None
        best = max(agreeing, key=lambda j: (_name_score(node.name, self.r.nodes[j].name), -j))
        self.twin[k], self.cand_of[best] = best, k
        return self.r.nodes[best]

    def _weights_agree(self, cnode, rnode) -> bool | None:
        cw, rw = self._cand_weight(cnode), _largest(self.r, rnode)
        if cw is None or rw is None:
            return None
        return same_weights(cw, rw)

    def _cand_weight(self, node) -> np.ndarray | None:
        if node.op_type in ("QLinearConv", "QGemm", "QLinearMatMul") and len(node.input) > 5 \
                and node.input[3] in self.c.const:
            w = self.c.value(node.input[3])
            params = self._qparams(node.input[4], node.input[5], 0)
            if w is None or params is None:
                return None
            if params.scale.size > 1:
                axes = [a for a in range(w.ndim) if w.shape[a] == params.scale.size]
                if not axes:
                    return None
                params.axis = axes[0]
            return dequantize(w, params)
        return _largest(self.c, node)

    def _next(self, out: str) -> set[tuple[str, int]]:
        """(family, number of activation inputs) of the candidate's compute nodes reading `out` through Q/DQ."""
        found, todo, seen = set(), [out], {out}
        while todo:
            for j in self.c.readers.get(todo.pop(), []):
                node = self.c.nodes[j]
                if node.op_type in QDQ_OPS:
                    todo += [o for o in node.output if o and o not in seen]
                    seen.update(node.output)
                else:
                    found.add((family(node.op_type), len(self.data_inputs(node))))
        return found

    def _absorbable(self, j: int, t: str) -> bool:
        node = self.r.nodes[j]
        return (node.op_type in ABSORBABLE and bool(node.output) and bool(node.output[0])
                and all(i in self.r.const for i in node.input if i and i != t) and j not in self.cand_of)

    def _extend(self, t: str, out: str) -> tuple[str, list[int]]:
        """From FP32 tensor t, follow the ops the candidate holds inside the kernel that writes `out` (absorbed: a
        single reader, constant other inputs, and no candidate node of that kind reading `out`)."""
        after, chain = self._next(out), []
        while t not in self.r.outputs:
            readers = self.r.readers.get(t, [])
            if len(readers) != 1 or not self._absorbable(readers[0], t):
                break
            node = self.r.nodes[readers[0]]
            if (family(node.op_type), 1) in after:
                break
            chain.append(readers[0])
            t = node.output[0]
        return t, chain

    def _chain_to(self, start: str, target: str) -> list[int]:
        """The FP32 nodes from tensor `start` to tensor `target` through absorbable ops ([] when there is no such
        path)."""
        chain, t = [], start
        while t != target:
            readers = self.r.readers.get(t, [])
            if not start or len(readers) != 1 or self.r.nodes[readers[0]].op_type not in ABSORBABLE \
                    or len(chain) > 8:
                return []
            chain.append(readers[0])
            t = self.r.nodes[readers[0]].output[0]
        return chain

    # --- the answer -----------------------------------------------------------------------------------------

    def sources(self, quantized: set[str]) -> list[Source]:
        """One candidate tensor per FP32 tensor, chosen to keep integer kernels fused (module docstring)."""
        best: dict[str, tuple[tuple[int, int], str, QParams | None, Meaning]] = {}
        for position, (name, meaning) in enumerate(self.meaning.items()):
            if meaning.opaque:
                continue
            if meaning.reads:
                rank, tensor, q = 0, meaning.reads, meaning.reads_q
            elif meaning.q is not None:
                rank, tensor, q = 1, name, meaning.q
            else:
                rank, tensor, q = 2, name, None
            if name in self.c.outputs:              # what the candidate outputs as it is: exposing it changes nothing
                rank, tensor, q = -1, name, meaning.q
            key = (rank + (3 if meaning.how == "reshape" else 0), position)
            if meaning.fp32 not in best or key < best[meaning.fp32][0]:
                best[meaning.fp32] = (key, tensor, q, meaning)
        found = []
        for fp32, (_, tensor, q, meaning) in best.items():
            op, order = self.ref_op(fp32)
            item = Source(fp32, tensor, op, order, nodes=self.cand_nodes(tensor, quantized),
                          fp32_nodes=self.fp32_nodes(fp32, quantized), how=meaning.how)
            if q is not None and q.scale.size == 1:
                item.scale, item.zero_point, item.dtype = float(q.scale[0]), int(q.zero_point[0]), q.dtype
            elif q is not None:
                item.scales, item.axis, item.dtype = [float(s) for s in q.scale], q.axis, q.dtype
                item.zero_points = [int(z) for z in np.broadcast_to(q.zero_point, q.scale.shape)]
            found.append(item)
        return sorted(found, key=lambda s: (s.order, s.fp32))

    def cand_nodes(self, tensor: str, quantized: set[str]) -> list[str]:
        """The candidate's compute nodes around `tensor` (its producer and its readers, through Q/DQ) that compute
        on integers: the producer first."""
        names, t = [], tensor
        while t in self.c.producer:
            node = self.c.nodes[self.c.producer[t]]
            if node.op_type not in QDQ_OPS:
                names.append(node.name)
                break
            t = node.input[0]
        todo, seen = [tensor], {tensor}
        while todo:
            for j in self.c.readers.get(todo.pop(), []):
                node = self.c.nodes[j]
                if node.op_type in QDQ_OPS:
                    todo += [o for o in node.output if o and o not in seen]
                    seen.update(node.output)
                else:
                    names.append(node.name)
        return [n for n in dict.fromkeys(names) if n and n in quantized]

    def fp32_nodes(self, fp32: str, quantized: set[str]) -> list[str]:
        """The FP32 nodes around `fp32` (its producer, the ops fused with it, its readers) whose candidate
        counterpart computes on integers."""
        around = []
        k = self.r.producer.get(fp32)
        head = self.cand_of.get(k) if k is not None else None
        if head is not None:                        # the candidate node that computes it: its twin, what it fused
            around += sorted(j for j, c in self.cand_of.items() if c == head)
        elif k is not None:
            around.append(k)
        around += self.r.readers.get(fp32, [])
        names = []
        for j in dict.fromkeys(around):
            cand = self.cand_of.get(j)
            if cand is not None and self.c.nodes[cand].name in quantized and self.r.nodes[j].name:
                names.append(self.r.nodes[j].name)
        return names

    def fp32_unpaired(self, paired: set[str]) -> dict[str, str]:
        """Why each FP32 activation no candidate tensor holds is unpaired."""
        reasons = {}
        for name in [n for node in self.r.nodes for n in node.output if n in self.r.act]:
            if name in paired:
                continue
            op, _ = self.ref_op(name)
            if name in self.fused:
                k, end = self.fused[name]
                node = self.c.nodes[k]
                reasons[name] = (f"fused into the candidate's {node.name or node.op_type} ({node.op_type}), which "
                                 f"holds {end}: the candidate never computes {name} on its own")
            elif self.root(name) != name and self.root(name) in paired:
                reasons[name] = f"{self.root(name)} in another shape ({op}), which is paired"
            elif any(m.fp32 == name and m.opaque for m in self.meaning.values()):
                reasons[name] = "held only in integers quantized at run time (dynamic quantization: no scale)"
            else:
                node = self.r.nodes[self.r.producer[name]]
                missing = [i for i in self.r.act_inputs(node)
                           if i not in paired and self.root(i) not in paired and i not in self.fused]
                k = self.r.producer[name]
                reasons[name] = (f"computed from {missing[0]}, which no candidate tensor holds" if missing else
                                 f"the candidate's {self.ref_rejected[k]} reads what this {node.op_type} "
                                 f"({node.name or 'unnamed'}) reads, but its weights are another layer's"
                                 if k in self.ref_rejected else
                                 f"no candidate node computes this {node.op_type} "
                                 f"({node.name or 'unnamed'}) of what it reads")
        return reasons

    def cand_unpaired(self) -> dict[str, str]:
        """Why each candidate tensor that stands for no FP32 tensor is unpaired (Q/DQ outputs left out: their
        input's reason says it)."""
        out = {}
        for name, reason in self.why.items():
            k = self.c.producer.get(name)
            if k is None or self.c.nodes[k].op_type not in QDQ_OPS:
                out[name] = reason
        return out


def _largest(graph: Graph, node) -> np.ndarray | None:
    """A node's weight: its largest constant input of two or more dimensions."""
    arrays = [graph.value(i) for i in node.input if i and i in graph.const]
    arrays = [a for a in arrays if a is not None and a.ndim >= 2 and a.dtype.kind == "f"]
    return max(arrays, key=lambda a: a.size) if arrays else None


def pair(cg, rg) -> tuple[Pairing, list[Source], set[str]]:
    """Walk candidate graph `cg` against reference graph `rg`: (the walk, the sources, the candidate's nodes that
    compute on integers)."""
    walk = Pairing(cg, rg)
    quantized = quantized_nodes(cg)
    return walk, walk.sources(quantized), quantized


def plan_onnx(candidate: Path, reference: Path, work: Path, feeds: list[dict[str, np.ndarray]] | None = None) -> Plan:
    """The ONNX plan: the pairing, and the two models with the paired tensors exposed as outputs under `work`.
    `feeds` (the evaluation samples, one dict of inputs per sample, as the model takes them): each model's top-level
    Ifs whose condition they fix are replaced by the branch taken (specialize.py), so its tensors pair."""
    import onnx

    from tiergate.explain.specialize import specialize

    done = {"candidate": specialize(onnx.load(str(candidate)), feeds),
            "reference": specialize(onnx.load(str(reference)), feeds)}
    cand, ref = done["candidate"].model, done["reference"].model
    for graph in (cand.graph, ref.graph):    # an exporter's unnamed nodes named as --fix names them (recipe.py)
        name_nodes(graph)
    walk, sources, quantized = pair(cand.graph, ref.graph)
    if not any(s.op != "input" for s in sources):
        first = next(iter(walk.cand_unpaired().items()), None)
        raise InputError(f"{candidate} and {reference}: no tensor in common (no candidate tensor holds what an FP32 "
                         "tensor holds, by name, by the quantizer's naming or by structure)"
                         + (f": {first[0]}: {first[1]}" if first else "") + ": nothing to pair")
    r_outputs = [o.name for o in ref.graph.output]
    skipped_reasons = {**done["reference"].skipped, **done["candidate"].skipped}
    skipped = sorted(set(_subgraph_outputs(ref.graph)) | set(_subgraph_outputs(cand.graph)) | set(skipped_reasons))
    paired = {s.fp32 for s in sources}
    # an FP32 output that repeats a paired tensor (an Identity at the end the candidate does not have) pairs with it
    for name in r_outputs:
        if name not in paired and walk.root(name) in paired:
            held = next(s for s in sources if s.fp32 == walk.root(name))
            op, order = walk.ref_op(name)
            sources.append(replace(held, fp32=name, op=op, order=order, how="reshape"))
            paired.add(name)
    sources.sort(key=lambda s: (s.order, s.fp32))
    ref_path, cand_path = work / "reference-dump.onnx", work / "candidate-dump.onnx"
    c_inputs, r_inputs = {i.name for i in cand.graph.input}, {i.name for i in ref.graph.input}
    _expose(ref, [s.fp32 for s in sources if s.fp32 not in r_inputs], ref_path)
    _expose(cand, [s.tensor for s in sources if s.tensor not in c_inputs], cand_path)
    reasons = walk.cand_unpaired()
    return Plan("onnx", cand_path, ref_path, sources, skipped, sorted(reasons), r_outputs, sorted(quantized),
                reasons, walk.fp32_unpaired(paired), _branches(done), skipped_reasons)


def _branches(done: dict) -> list[dict]:
    """The branches taken, each once with the models (candidate, reference) it was taken in."""
    found: dict[tuple, dict] = {}
    for model, item in done.items():
        for branch in item.branches:
            entry = found.setdefault((branch.node, branch.branch, branch.why), {**branch.to_json(), "models": []})
            entry["models"].append(model)
    return list(found.values())


def _subgraph_outputs(graph) -> list[str]:
    """Every value computed inside a subgraph of `graph` (not exposable as a graph output)."""
    from tiergate.artifact.onnx_walk import subgraphs

    found = []
    for node in graph.node:
        for _, body in subgraphs(node):
            found += [out for n in body.node for out in n.output if out]
            found += _subgraph_outputs(body)
    return found


def _expose(model, names: list[str], out: Path) -> None:
    """`model` with `names` added to its graph outputs, written to `out` (deterministic: the dump cache keys on it)."""
    import onnx
    from onnx import helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    for name in dict.fromkeys(names):
        if name not in have:
            copy.graph.output.append(helper.ValueInfoProto(name=name))
    onnx.save(copy, str(out))
