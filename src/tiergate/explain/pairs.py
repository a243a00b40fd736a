"""The pairing's data, shared by the pairing of each format (onnx_pairing.py, ...) and the analysis (__init__.py):
which candidate tensor is dumped for which FP32 tensor (`Source`), and what is dumped on each tier (`Plan`).

A leaf: it imports nothing of tiergate, so the per-format pairing modules and the package's __init__ (which
re-exports both classes) can import it without an import cycle."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class Source:
    """One candidate tensor paired with one FP32 reference tensor."""

    fp32: str                    # the reference tensor (the layer's name in the report)
    tensor: str                  # the candidate tensor dumped
    op: str                      # the reference op that produced the FP32 tensor ("input" for inputs)
    order: int                   # topological position of that op in the reference
    scale: float | None = None   # integer tensors: dequantized with these
    zero_point: int = 0
    dtype: str = ""
    # keep-float candidates: the candidate's own nodes around the tensor (its producer, its consumers) that the
    # candidate quantized (TFLite: the tensor itself when the candidate quantizes it)
    nodes: list[str] = field(default_factory=list)
    # the same nodes in the FP32 reference (what onnxruntime's quantize_static takes as nodes_to_exclude when the
    # reference is quantized again): the layer's node, the activations fused into it, its consumers
    fp32_nodes: list[str] = field(default_factory=list)
    # an integer tensor quantized per channel (a scale and zero point per index of `axis` of the tensor, without
    # the sample axis): these instead of scale/zero_point
    scales: list[float] = field(default_factory=list)
    zero_points: list[int] = field(default_factory=list)
    axis: int = 1
    how: str = ""                # the evidence it was paired on: name, convention, structure, input, reshape
    location: list[str] = field(default_factory=list)   # TFLite: where the candidate's op came from (debug metadata)
    candidate_op: str = ""       # TFLite: the candidate op that writes `tensor` ("input" for inputs)


@dataclass
class Plan:
    """What to dump on each tier and how to pair it."""

    format: str
    candidate: Path
    reference: Path
    sources: list[Source] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)     # tensors left inside subgraphs: not exposable
    unpaired: list[str] = field(default_factory=list)    # candidate tensors with no FP32 counterpart
    outputs: list[str] = field(default_factory=list)     # the reference's graph outputs (end to end)
    quantized: list[str] = field(default_factory=list)   # the candidate's nodes that compute on integers
    reasons: dict[str, str] = field(default_factory=dict)        # why each candidate tensor in `unpaired` is
    fp32_unpaired: dict[str, str] = field(default_factory=dict)  # FP32 tensors no candidate tensor holds, and why
    # the If nodes specialized to the branch the evaluation data take (specialize.py): {"node", "branch", "why",
    # "models": ["candidate", "reference"]}, and why each tensor in `skipped` stays inside a subgraph
    branches: list[dict] = field(default_factory=list)
    skipped_reasons: dict[str, str] = field(default_factory=dict)
