"""The one small description every artifact (ONNX or TFLite) is loaded into.

This is a shared contract: the lint rules, the fingerprint, the diff, the data
validation and the gate all read it. Keep field names stable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, shape (int, or a str/None for a symbolic dim), numpy dtype name."""

    name: str
    shape: tuple[int | str | None, ...]
    dtype: str  # numpy dtype name: "float32", "int8", "uint8", "int64", ...


@dataclass(frozen=True)
class QuantParams:
    """Quantization parameters of one tensor (per-tensor: one scale; per-axis: many)."""

    tensor: str
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    dtype: str            # "int8", "uint8", "int16", ...
    axis: int | None = None


@dataclass
class Node:
    """One operator in topological order; `index` is its position in the graph."""

    index: int
    op: str                       # "Conv", "QuantizeLinear", "CONV_2D", ...
    name: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    # additive (subgraphs): where the node sits; "If_0/then_branch/Conv_3" for a node in a body graph
    path: str = ""
    scope: str = ""               # "If_0/then_branch/" inside a body graph, "" at top level

    @property
    def label(self) -> str:
        """The node's path (or name), for people."""
        return self.path or self.name or f"#{self.index}"


@dataclass
class Artifact:
    """A loaded model artifact, format-independent."""

    path: Path
    format: str                   # "onnx" or "tflite"
    sha256: str                   # content hash of the file (and its external data)
    size_bytes: int
    version: str                  # "opset 17" / "schema 3"
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    nodes: list[Node]
    quant: dict[str, QuantParams] = field(default_factory=dict)  # by tensor name
    initializers: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # name -> (shape, dtype)
    metadata: dict[str, str] = field(default_factory=dict)
    # additive (intake): element type of every tensor whose type is known, by name
    tensor_dtypes: dict[str, str] = field(default_factory=dict)
    # additive (intake): external-data locations exactly as written in the model (ONNX only)
    external_data: tuple[str, ...] = ()
    handle: Any = None            # the parsed format object (onnx.ModelProto / tflite Model), not serialised

    @property
    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    @property
    def is_quantized(self) -> bool:
        return bool(self.quant)
