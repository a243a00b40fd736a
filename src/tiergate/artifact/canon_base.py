"""The types and text helpers of the name-free graph view (see canonical.py) that every format shares.

A leaf module: it imports nothing from the format builders or the dispatcher.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from tiergate.artifact.model import QuantParams

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
