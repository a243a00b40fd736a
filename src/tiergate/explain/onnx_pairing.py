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

from dataclasses import replace
from pathlib import Path

import numpy as np

from tiergate.errors import InputError
from tiergate.explain.onnx_graph import (INTEGER_PASS, QLINEAR, RESHAPES, Graph, Meaning, QParams, convention,
                                         data_inputs, family, node_axis, qparams, readers_through_qdq)
from tiergate.explain.onnx_twins import Twins
from tiergate.explain.pairs import QDQ_OPS, Plan, Source
from tiergate.explain.recipe import name_nodes, quantized_nodes


class Pairing:
    """The candidate graph walked against the reference, node by node: the meaning of each candidate tensor (the FP32
    tensor it holds, `meaning`), why the rest stands for none (`why`), the FP32 tensors fused into a candidate kernel
    (`fused`); the FP32 side (twins, absorbed ops) is `twins`'."""

    def __init__(self, cg, rg):
        self.c, self.r = Graph(cg), Graph(rg)
        self.twins = Twins(self.c, self.r)
        self.meaning: dict[str, Meaning] = {}
        self.why: dict[str, str] = {}              # candidate tensor -> why it stands for no FP32 tensor
        self.fused: dict[str, tuple[int, str]] = {}   # FP32 tensor -> (candidate node, the FP32 tensor it holds)
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

    def _qdq_source(self, node, verb: str):
        """A QuantizeLinear's or DequantizeLinear's input meaning and its node's parameters; (None, None), with
        the reason recorded, when the input stands for no FP32 tensor."""
        src = self.meaning.get(node.input[0])
        if src is None:
            self.why[node.output[0]] = f"{verb} {node.input[0]}, which stands for no FP32 tensor"
            return None, None
        return src, qparams(self.c, node.input[1], node.input[2] if len(node.input) > 2 else "", node_axis(node))

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

    def _out_params(self, node) -> QParams | None:
        if node.op_type == "QLinearConcat":
            s, z = 0, 1
        else:
            s, z = QLINEAR[node.op_type][1]
        if len(node.input) <= s or not node.input[s]:
            return None                             # QGemm without an output scale: a float output
        return qparams(self.c, node.input[s], node.input[z] if len(node.input) > z else "", 1)

    def _compute(self, k: int, node) -> None:
        outs = [(i, o) for i, o in enumerate(node.output) if o and o in self.c.act]
        data = data_inputs(self.c, node)
        missing = [d for d in data if d not in self.meaning]
        metas = [self.meaning[d] for d in data if d in self.meaning]
        twin = self.twins.find(k, node, [m.fp32 for m in metas]) if data and not missing else None
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
                chain = self.twins.chain_to(twin.output[i], out) if twin is not None and i < len(twin.output) else []
                self._hold(k, out, Meaning(out, "name", q=q_out if integer else None), chain)
                continue
            if missing:
                self.why[out] = f"computed from {missing[0]}, which stands for no FP32 tensor"
                continue
            base = convention(out)
            start = twin.output[i] if twin is not None and i < len(twin.output) and twin.output[i] else ""
            if base and base in self.r.act:                    # (2) the quantizer's naming
                end, chain = self.twins.extend(base, out)
                self._hold(k, out, Meaning(end, "convention", q=q_out), self.twins.chain_to(start, base) + chain)
            elif start:                                        # (3) the structure
                end, chain = self.twins.extend(start, out)
                self._hold(k, out, Meaning(end, "structure", q=q_out), chain)
            elif node.op_type in RESHAPES and len(data) == 1:  # a reshape the reference does not have
                self.meaning[out] = replace(metas[0], how="reshape", reads="", reads_q=None,
                                            q=metas[0].q if integer else None)
            else:
                self.why[out] = self.twins.rejected.get(k) or (
                    f"no FP32 {family(node.op_type)} reads what it reads ({', '.join(m.fp32 for m in metas)})"
                    if metas else f"{node.op_type} reads no activation")

    def _hold(self, k: int, out: str, meaning: Meaning, chain: list[int]) -> None:
        """`out` of candidate node k holds meaning.fp32; the FP32 nodes of `chain` are computed inside node k."""
        self.meaning[out] = meaning
        twin = self.twins.twin.get(k)
        tensors = ([self.r.nodes[twin].output[0]] if twin is not None and chain else []) + \
                  [self.r.nodes[j].output[0] for j in chain]
        for j in chain:
            self.twins.cand_of.setdefault(j, k)
        for name in tensors:
            if name != meaning.fp32:
                self.fused.setdefault(name, (k, meaning.fp32))


# --- the answer ---------------------------------------------------------------------------------------------


def sources(walk: Pairing, quantized: set[str]) -> list[Source]:
    """One candidate tensor per FP32 tensor, chosen to keep integer kernels fused (module docstring)."""
    best: dict[str, tuple[tuple[int, int], str, QParams | None, Meaning]] = {}
    for position, (name, meaning) in enumerate(walk.meaning.items()):
        if meaning.opaque:
            continue
        if meaning.reads:
            rank, tensor, q = 0, meaning.reads, meaning.reads_q
        elif meaning.q is not None:
            rank, tensor, q = 1, name, meaning.q
        else:
            rank, tensor, q = 2, name, None
        if name in walk.c.outputs:              # what the candidate outputs as it is: exposing it changes nothing
            rank, tensor, q = -1, name, meaning.q
        key = (rank + (3 if meaning.how == "reshape" else 0), position)
        if meaning.fp32 not in best or key < best[meaning.fp32][0]:
            best[meaning.fp32] = (key, tensor, q, meaning)
    found = []
    for fp32, (_, tensor, q, meaning) in best.items():
        op, order = walk.twins.ref_op(fp32)
        item = Source(fp32, tensor, op, order, nodes=cand_nodes(walk, tensor, quantized),
                      fp32_nodes=fp32_nodes(walk, fp32, quantized), how=meaning.how)
        if q is not None and q.scale.size == 1:
            item.scale, item.zero_point, item.dtype = float(q.scale[0]), int(q.zero_point[0]), q.dtype
        elif q is not None:
            item.scales, item.axis, item.dtype = [float(s) for s in q.scale], q.axis, q.dtype
            item.zero_points = [int(z) for z in np.broadcast_to(q.zero_point, q.scale.shape)]
        found.append(item)
    return sorted(found, key=lambda s: (s.order, s.fp32))


def cand_nodes(walk: Pairing, tensor: str, quantized: set[str]) -> list[str]:
    """The candidate's compute nodes around `tensor` (its producer and its readers, through Q/DQ) that compute
    on integers: the producer first."""
    names, t = [], tensor
    while t in walk.c.producer:
        node = walk.c.nodes[walk.c.producer[t]]
        if node.op_type not in QDQ_OPS:
            names.append(node.name)
            break
        t = node.input[0]
    names += [node.name for node in readers_through_qdq(walk.c, tensor)]
    return [n for n in dict.fromkeys(names) if n and n in quantized]


def fp32_nodes(walk: Pairing, fp32: str, quantized: set[str]) -> list[str]:
    """The FP32 nodes around `fp32` (its producer, the ops fused with it, its readers) whose candidate
    counterpart computes on integers."""
    around = []
    k = walk.r.producer.get(fp32)
    head = walk.twins.cand_of.get(k) if k is not None else None
    if head is not None:                        # the candidate node that computes it: its twin, what it fused
        around += sorted(j for j, c in walk.twins.cand_of.items() if c == head)
    elif k is not None:
        around.append(k)
    around += walk.r.readers.get(fp32, [])
    names = []
    for j in dict.fromkeys(around):
        cand = walk.twins.cand_of.get(j)
        if cand is not None and walk.c.nodes[cand].name in quantized and walk.r.nodes[j].name:
            names.append(walk.r.nodes[j].name)
    return names


def fp32_unpaired(walk: Pairing, paired: set[str]) -> dict[str, str]:
    """Why each FP32 activation no candidate tensor holds is unpaired."""
    reasons = {}
    for name in [n for node in walk.r.nodes for n in node.output if n in walk.r.act]:
        if name in paired:
            continue
        op, _ = walk.twins.ref_op(name)
        if name in walk.fused:
            k, end = walk.fused[name]
            node = walk.c.nodes[k]
            reasons[name] = (f"fused into the candidate's {node.name or node.op_type} ({node.op_type}), which "
                             f"holds {end}: the candidate never computes {name} on its own")
        elif walk.twins.root(name) != name and walk.twins.root(name) in paired:
            reasons[name] = f"{walk.twins.root(name)} in another shape ({op}), which is paired"
        elif any(m.fp32 == name and m.opaque for m in walk.meaning.values()):
            reasons[name] = "held only in integers quantized at run time (dynamic quantization: no scale)"
        else:
            node = walk.r.nodes[walk.r.producer[name]]
            missing = [i for i in walk.r.act_inputs(node)
                       if i not in paired and walk.twins.root(i) not in paired and i not in walk.fused]
            k = walk.r.producer[name]
            reasons[name] = (f"computed from {missing[0]}, which no candidate tensor holds" if missing else
                             f"the candidate's {walk.twins.ref_rejected[k]} reads what this {node.op_type} "
                             f"({node.name or 'unnamed'}) reads, but its weights are another layer's"
                             if k in walk.twins.ref_rejected else
                             f"no candidate node computes this {node.op_type} "
                             f"({node.name or 'unnamed'}) of what it reads")
    return reasons


def cand_unpaired(walk: Pairing) -> dict[str, str]:
    """Why each candidate tensor that stands for no FP32 tensor is unpaired (Q/DQ outputs left out: their
    input's reason says it)."""
    out = {}
    for name, reason in walk.why.items():
        k = walk.c.producer.get(name)
        if k is None or walk.c.nodes[k].op_type not in QDQ_OPS:
            out[name] = reason
    return out


def pair(cg, rg) -> tuple[Pairing, list[Source], set[str]]:
    """Walk candidate graph `cg` against reference graph `rg`: (the walk, the sources, the candidate's nodes that
    compute on integers)."""
    walk = Pairing(cg, rg)
    quantized = quantized_nodes(cg)
    return walk, sources(walk, quantized), quantized


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
        first = next(iter(cand_unpaired(walk).items()), None)
        raise InputError(f"{candidate} and {reference}: no tensor in common (no candidate tensor holds what an FP32 "
                         "tensor holds, by name, by the quantizer's naming or by structure)"
                         + (f": {first[0]}: {first[1]}" if first else "") + ": nothing to pair")
    r_outputs = [o.name for o in ref.graph.output]
    skipped_reasons = {**done["reference"].skipped, **done["candidate"].skipped}
    skipped = sorted(set(_subgraph_outputs(ref.graph)) | set(_subgraph_outputs(cand.graph)) | set(skipped_reasons))
    paired = {s.fp32 for s in sources}
    # an FP32 output that repeats a paired tensor (an Identity at the end the candidate does not have) pairs with it
    for name in r_outputs:
        if name not in paired and walk.twins.root(name) in paired:
            held = next(s for s in sources if s.fp32 == walk.twins.root(name))
            op, order = walk.twins.ref_op(name)
            sources.append(replace(held, fp32=name, op=op, order=order, how="reshape"))
            paired.add(name)
    sources.sort(key=lambda s: (s.order, s.fp32))
    ref_path, cand_path = work / "reference-dump.onnx", work / "candidate-dump.onnx"
    c_inputs, r_inputs = {i.name for i in cand.graph.input}, {i.name for i in ref.graph.input}
    _expose(ref, [s.fp32 for s in sources if s.fp32 not in r_inputs], ref_path)
    _expose(cand, [s.tensor for s in sources if s.tensor not in c_inputs], cand_path)
    reasons = cand_unpaired(walk)
    return Plan("onnx", cand_path, ref_path, sources, skipped, sorted(reasons), r_outputs, sorted(quantized),
                reasons, fp32_unpaired(walk, paired), _branches(done), skipped_reasons)


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
