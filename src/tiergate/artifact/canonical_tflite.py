"""Name-free view of a TFLite subgraph 0 (see canonical.py; shared pieces in canon_base.py)."""

from __future__ import annotations

import json

from tiergate.artifact.canon_base import CanonGraph, CanonNode, digest, quant_text, spec_text
from tiergate.artifact.model import Artifact


def canonical_tflite(artifact: Artifact) -> CanonGraph:
    handle = artifact.handle
    spec = {name: spec_text(artifact.tensor_dtypes[name], handle.shapes[name]) for name in handle.tensor_names}
    refs = {name: ("c:" if name in handle.constants else "t:") + spec[name] for name in handle.tensor_names}
    for position, tensor in enumerate(artifact.inputs):
        refs[tensor.name] = f"in{position}"
    digests: dict[str, str] = {}
    nodes = []
    used: set[str] = set()
    for node in artifact.nodes:
        weights, quant = {}, {}
        for slot, name in enumerate(node.inputs):
            used.add(name)
            if name in handle.constants:
                if name not in digests:
                    digests[name] = digest(handle.constants[name])
                weights[f"in{slot}"] = digests[name]
            if name in artifact.quant:
                quant[f"in{slot}"] = quant_text(artifact.quant[name])
        for k, name in enumerate(node.outputs):
            if name in artifact.quant:
                quant[f"out{k}"] = quant_text(artifact.quant[name])
        nodes.append(CanonNode(
            index=node.index, op=node.op, domain=node.domain, name=node.name,
            attrs={k: json.dumps(v) for k, v in node.attributes.items()},
            inputs=tuple(refs[n] if n else "" for n in node.inputs),
            outputs=tuple(spec[n] for n in node.outputs),
            weights=weights, quant=quant,
        ))
        for k, name in enumerate(node.outputs):
            refs[name] = f"n{node.index}:{k}"
    loose = sorted(set(handle.constants) - used)
    return CanonGraph(
        inputs=tuple(spec_text(t.dtype, t.shape) for t in artifact.inputs),
        outputs=tuple(refs[t.name] for t in artifact.outputs),
        nodes=tuple(nodes),
        loose_weights=tuple(sorted(digest(handle.constants[n]) for n in loose)),
        loose_specs=tuple(sorted(spec[n] for n in loose)),
    )
