"""Twins: the FP32 node a candidate node computes (of its family, reading the same FP32 tensors, ties broken by
name and by weights), and the FP32 ops the candidate holds inside that node's kernel (absorbed: a folded
BatchNormalization, a constant Add or Mul, a Relu or Clip in the output's quantization)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from tiergate.explain.onnx_graph import (ABSORBABLE, RESHAPES, Graph, data_inputs, dequantize, family,
                                         largest_weight, name_score, qparams, readers_through_qdq, same_weights)


class Twins:
    """The FP32 side of the walk: which FP32 node each candidate node computes (`twin`, `cand_of`), what the candidate
    absorbed into its kernels, and why a node of the same kind is not a twin (`rejected`, `ref_rejected`)."""

    def __init__(self, c: Graph, r: Graph):
        self.c, self.r = c, r
        self.twin: dict[int, int] = {}             # candidate node -> the FP32 node it computes
        self.cand_of: dict[int, int] = {}          # FP32 node (its twin or an op absorbed into it) -> candidate node
        self.rejected: dict[int, str] = {}         # candidate node -> why no FP32 node of its kind is its twin
        self.ref_rejected: dict[int, str] = {}     # FP32 node -> a candidate node of its kind with other weights
        self._root: dict[str, str] = {}
        self._by_root: dict[str, list[int]] = {}
        for k, node in enumerate(self.r.nodes):
            for name in dict.fromkeys(self.r.act_inputs(node)):
                self._by_root.setdefault(self.root(name), []).append(k)

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

    def find(self, k: int, node, refs: list[str]):
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
        agreeing = [j for j in options if self.weights_agree(node, self.r.nodes[j]) is not False]
        if options and not agreeing:
            self.rejected[k] = (f"its weights are not those of the FP32 {fam} reading "
                                f"{', '.join(sorted(roots))} ({', '.join(self.r.nodes[j].name for j in options)})")
            for j in options:
                self.ref_rejected.setdefault(j, node.name or node.op_type)
        if not agreeing:
            return None
        best = max(agreeing, key=lambda j: (name_score(node.name, self.r.nodes[j].name), -j))
        self.twin[k], self.cand_of[best] = best, k
        return self.r.nodes[best]

    def weights_agree(self, cnode, rnode) -> bool | None:
        cw, rw = self.cand_weight(cnode), largest_weight(self.r, rnode)
        if cw is None or rw is None:
            return None
        return same_weights(cw, rw)

    def cand_weight(self, node) -> np.ndarray | None:
        if node.op_type in ("QLinearConv", "QGemm", "QLinearMatMul") and len(node.input) > 5 \
                and node.input[3] in self.c.const:
            w = self.c.value(node.input[3])
            params = qparams(self.c, node.input[4], node.input[5], 0)
            if w is None or params is None:
                return None
            if params.scale.size > 1:
                axes = [a for a in range(w.ndim) if w.shape[a] == params.scale.size]
                if not axes:
                    return None
                params.axis = axes[0]
            return dequantize(w, params)
        return largest_weight(self.c, node)

    def compute_after(self, out: str) -> set[tuple[str, int]]:
        """(family, number of activation inputs) of the candidate's compute nodes reading `out` through Q/DQ."""
        return {(family(node.op_type), len(data_inputs(self.c, node))) for node in readers_through_qdq(self.c, out)}

    def absorbable(self, j: int, t: str) -> bool:
        node = self.r.nodes[j]
        return (node.op_type in ABSORBABLE and bool(node.output) and bool(node.output[0])
                and all(i in self.r.const for i in node.input if i and i != t) and j not in self.cand_of)

    def extend(self, t: str, out: str) -> tuple[str, list[int]]:
        """From FP32 tensor t, follow the ops the candidate holds inside the kernel that writes `out` (absorbed: a
        single reader, constant other inputs, and no candidate node of that kind reading `out`)."""
        after, chain = self.compute_after(out), []
        while t not in self.r.outputs:
            readers = self.r.readers.get(t, [])
            if len(readers) != 1 or not self.absorbable(readers[0], t):
                break
            node = self.r.nodes[readers[0]]
            if (family(node.op_type), 1) in after:
                break
            chain.append(readers[0])
            t = node.output[0]
        return t, chain

    def chain_to(self, start: str, target: str) -> list[int]:
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
