"""A name-free view of a graph, shared by the fingerprint and the diff.

Every tensor is named by where it comes from, not by its name: graph input
`in0`, output 1 of node 3 `n3:1`, a constant `c:<dtype><dims>`. Each node keeps
three things apart: its structure (op, attributes, wiring), the digests of the
weights it reads, and the quantization parameters of its tensors.

`canonical(artifact)` picks the format's builder (canonical_onnx.py, canonical_tflite.py);
the types and text helpers they share live in canon_base.py, a leaf module, so the
builders never import this dispatcher back.
"""

from __future__ import annotations

from tiergate.artifact.canon_base import CanonGraph, CanonNode
from tiergate.artifact.model import Artifact

__all__ = ["CanonGraph", "CanonNode", "canonical"]


def canonical(artifact: Artifact) -> CanonGraph:
    if artifact.format == "tflite":
        from tiergate.artifact.canonical_tflite import canonical_tflite

        return canonical_tflite(artifact)
    from tiergate.artifact.canonical_onnx import canonical_onnx

    return canonical_onnx(artifact.handle.graph)
