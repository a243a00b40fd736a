"""Three hashes of an artifact, kept apart: structure, weights, quantization.

- structure: ops, attributes, wiring, tensor types and shapes; invariant to
  node and value names and to the order of initializers.
- weights: the bytes of every constant, in the order the graph first reads them.
- quantization: every scale and zero point, in the same order.

A re-save gives the same three; changing any attribute, weight or scale
changes exactly the hash it belongs to. `combined` is a short id of all three.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from tiergate.artifact.canonical import CanonGraph, canonical
from tiergate.artifact.model import Artifact


@dataclass(frozen=True)
class Fingerprint:
    structure: str
    weights: str
    quantization: str

    @property
    def combined(self) -> str:
        joined = f"{self.structure}:{self.weights}:{self.quantization}".encode()
        return hashlib.sha256(joined).hexdigest()[:16]

    def to_json(self) -> dict:
        return {**asdict(self), "combined": self.combined}


def fingerprint(artifact: Artifact) -> Fingerprint:
    return fingerprint_graph(canonical(artifact), artifact.format)


def fingerprint_graph(graph: CanonGraph, fmt: str) -> Fingerprint:
    structure = hashlib.sha256(fmt.encode())
    structure.update(json.dumps([graph.inputs, graph.outputs, graph.loose_specs]).encode())
    weights = hashlib.sha256()
    quant = hashlib.sha256()
    for node in graph.nodes:
        structure.update(node.structure_text().encode())
        # nodes without weights (or quantization) add nothing, so inserting an Identity moves only `structure`
        if node.weights:
            weights.update(json.dumps(sorted(node.weights.items())).encode())
        if node.quant:
            quant.update(json.dumps(sorted(node.quant.items())).encode())
    weights.update(json.dumps(graph.loose_weights).encode())
    return Fingerprint(structure.hexdigest(), weights.hexdigest(), quant.hexdigest())
