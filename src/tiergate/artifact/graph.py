"""Graph walking shared by the lint rules and the diff: who produces and reads each tensor,
and whether each node computes in float or on quantized values."""

from __future__ import annotations

from dataclasses import dataclass

from tiergate.artifact.model import Artifact, Node

FLOAT_DTYPES = frozenset({"float32", "float16", "float64", "bfloat16"})
QUANT_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int4", "uint4"})
# ops that move or relabel data, or mark quantization, rather than compute
NEUTRAL_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Identity", "Constant", "Shape",
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Cast",
    "QUANTIZE", "DEQUANTIZE", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "SHAPE", "TRANSPOSE", "CAST",
})
_INTEGER_ONNX_OPS = frozenset({"ConvInteger", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                               "QGemm", "QAttention", "DynamicQuantizeLSTM", "MatMulNBits"})
# layout moves onnxruntime inserts (NCHWc)
NEUTRAL_OPS = NEUTRAL_OPS | {"ReorderInput", "ReorderOutput"}


@dataclass
class GraphIndex:
    producer: dict[str, int]          # tensor -> index of the node writing it
    consumers: dict[str, list[int]]   # tensor -> indices of nodes reading it
    outputs: set[str]                 # graph outputs

    def next_nodes(self, node: Node) -> list[int]:
        return sorted({c for t in node.outputs for c in self.consumers.get(t, [])})

    def prev_nodes(self, node: Node) -> list[int]:
        return sorted({self.producer[t] for t in node.inputs if t in self.producer})

    def sole_consumer(self, node: Node) -> int | None:
        """The one node reading this node's outputs, when there is exactly one and no graph output."""
        if any(t in self.outputs for t in node.outputs):
            return None
        readers = self.next_nodes(node)
        return readers[0] if len(readers) == 1 else None


def index_graph(artifact: Artifact) -> GraphIndex:
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for node in artifact.nodes:
        for t in node.outputs:
            if t:
                producer[t] = node.index
        for t in node.inputs:
            if t:
                consumers.setdefault(t, []).append(node.index)
    return GraphIndex(producer, consumers, {t.name for t in artifact.outputs})


def node_precision(artifact: Artifact, index: GraphIndex | None = None, *, fused: bool = False) -> list[str]:
    """'quantized', 'float' or 'neutral' for every node.

    A node computes on quantized values when no float tensor reaches it except
    (ONNX QDQ) through a DequantizeLinear, whose pairing with the node is what a
    runtime fuses into an integer kernel. In TFLite a DEQUANTIZE is a real
    conversion, so a node reading its output computes in float.

    fused: the graph is a runtime's optimized graph, where every Q/DQ pair the runtime
    could fuse is already an integer op: a DequantizeLinear left there is a real
    conversion, as in TFLite.
    """
    index = index or index_graph(artifact)
    qdq = artifact.format == "onnx" and not fused
    result = []
    for node in artifact.nodes:
        if node.op in NEUTRAL_OPS:
            result.append("neutral")
        elif node.op.startswith("QLinear") or node.op in _INTEGER_ONNX_OPS:
            result.append("quantized")
        else:
            result.append(_classify(artifact, index, node, qdq))
    return result


def _classify(artifact: Artifact, index: GraphIndex, node: Node, qdq: bool) -> str:
    kinds = {_input_kind(artifact, index, tensor, qdq) for tensor in node.inputs if tensor}
    if "float" in kinds:
        return "float"
    return "quantized" if "quantized" in kinds else "neutral"


def _input_kind(artifact: Artifact, index: GraphIndex, tensor: str, qdq: bool) -> str:
    dtype = artifact.tensor_dtypes.get(tensor, "float32")
    if dtype in QUANT_DTYPES:
        return "quantized"
    if dtype not in FLOAT_DTYPES:
        return "other"
    source = index.producer.get(tensor)
    if qdq and source is not None and artifact.nodes[source].op == "DequantizeLinear":
        return "quantized"
    return "float"


def precision_counts(artifact: Artifact) -> dict[str, int]:
    kinds = node_precision(artifact)
    return {"quantized": kinds.count("quantized"), "float": kinds.count("float")}
