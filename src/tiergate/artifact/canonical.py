"""A name-free view of a graph, shared by the fingerprint and the diff.

Every tensor is named by where it comes from, not by its name: graph input
`in0`, output 1 of node 3 `n3:1`, a constant `c:<dtype><dims>`. Each node keeps
three things apart: its structure (op, attributes, wiring), the digests of the
weights it reads, and the quantization parameters of its tensors.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from tiergate.artifact.model import Artifact, QuantParams

_SHOWN_VALUES = 8  # quantization parameters longer than this are shown as a digest


@dataclass(frozen=True)
class CanonNode:
    index: int
    op: str
    domain: str
    name: str
    attrs: dict[str, str]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] = ()                       # output specs where the format records them
    weights: dict[str, str] = field(default_factory=dict)  # slot ("in1", "attr:value") -> sha256
    quant: dict[str, str] = field(default_factory=dict)    # slot ("in0", "out0") -> parameters

    def structure_text(self) -> str:
        return json.dumps([self.op, self.domain, sorted(self.attrs.items()), self.inputs, self.outputs])


@dataclass(frozen=True)
class CanonGraph:
    inputs: tuple[str, ...]            # "dtype[shape]" by position
    outputs: tuple[str, ...]           # refs by position
    nodes: tuple[CanonNode, ...]
    loose_weights: tuple[str, ...] = ()  # digests of constants no node reads (sorted)
    loose_specs: tuple[str, ...] = ()


def canonical(artifact: Artifact) -> CanonGraph:
    if artifact.format == "tflite":
        from tiergate.artifact.canonical_tflite import canonical_tflite

        return canonical_tflite(artifact)
    from tiergate.artifact.canonical_onnx import canonical_onnx

    return canonical_onnx(artifact.handle.graph)


def digest(data) -> str:
    return hashlib.sha256(data).hexdigest()


def spec_text(dtype: str, shape) -> str:
    return f"{dtype}[{','.join('?' if d is None else str(d) for d in shape)}]"


def values_text(dtype: str, array: np.ndarray) -> str:
    flat = np.asarray(array).reshape(-1)
    if flat.size > _SHOWN_VALUES:
        return f"{dtype}[{flat.size}] sha256:{digest(np.ascontiguousarray(flat).tobytes())[:16]}"
    return f"{dtype}{[v.item() for v in flat]}"


def quant_text(params: QuantParams) -> str:
    axis = "" if params.axis is None else f" axis={params.axis}"
    scale = values_text("", np.array(params.scale, dtype=np.float64))
    zero = values_text("", np.array(params.zero_point, dtype=np.int64))
    return f"{params.dtype}{axis} scale={scale} zero_point={zero}"
