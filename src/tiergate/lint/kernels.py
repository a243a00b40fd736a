"""The lowered graph a compiled tier runs, for the graph rules: one node per kernel.

A TVM tier runs what its compiler made of the ONNX file, not the file: the Relax ONNX frontend drops an Identity,
imports QuantizeLinear/DequantizeLinear as quantize and dequantize in float, and FuseOps merges an operator into its
producer's kernel only where TVM's op patterns allow it. The compile records the kernels `main` calls (containers/
tvm/tiergate_tvm_compile.py, `kernel_graph`: each kernel's operators with their op pattern and input dtypes); this
module makes that record an Artifact (format "tvm") the graph rules judge like onnxruntime's optimized graph: a node
per kernel, its op the operators it fuses joined by "+" ("conv2d+add+relu"), its inputs the kernels it reads.
"""

from __future__ import annotations

from pathlib import Path

from tiergate.artifact.model import Artifact, Node, TensorSpec

FORMAT = "tvm"
# TVM's OpPatternKind
PATTERNS = {0: "elementwise", 1: "broadcast", 2: "injective", 3: "reduction", 4: "out-elementwise-fusable",
            7: "tuple", 8: "opaque"}
FUSABLE_AFTER_COMPUTE = 1        # FuseOps fuses elementwise and broadcast operators into a compute kernel's output
COMPUTE = 4                      # conv2d, matmul, dense...: the operators that do a model's arithmetic
ACTIVATIONS = {"relu", "relu6", "leaky_relu", "prelu", "clip", "sigmoid", "hard_sigmoid", "tanh", "gelu", "gelu_tanh",
               "silu", "hardswish", "elu", "selu", "softplus", "mish"}
NORMALIZATIONS = {"batch_norm"}
QUANTIZE = {"quantize", "dequantize"}
INTEGER = ("int", "uint")


def kernel_artifact(runtime, source: Artifact) -> Artifact | None:
    """The tier's lowered graph as an Artifact, None when its compile recorded none. It carries the source's
    quantization parameters (a quantized file stays a quantized model, whatever the compiler computes it in)."""
    kernels = list(getattr(runtime, "kernels", None) or [])
    if not kernels:
        return None
    nodes = []
    for index, kernel in enumerate(kernels):
        ops = [list(op) for op in kernel.get("ops") or []]
        nodes.append(Node(index, "+".join(op[0] for op in ops) or str(kernel.get("kernel", "")),
                          str(kernel.get("name", "")), [name for name in kernel.get("inputs") or [] if name],
                          [str(kernel.get("name", ""))], attributes={"kernel": kernel.get("kernel", ""), "ops": ops}))
    read = {name for node in nodes for name in node.inputs}
    dtypes = {str(k.get("name", "")): str(k.get("dtype", "")) for k in kernels}
    outputs = [TensorSpec(node.name, (), dtypes.get(node.name, "")) for node in nodes if node.name not in read]
    return Artifact(path=Path(source.path), format=FORMAT, sha256=source.sha256, size_bytes=source.size_bytes,
                    version=str((getattr(runtime, "compile", None) or {}).get("tvm_version", "")),
                    inputs=list(source.inputs), outputs=outputs, nodes=nodes, quant=dict(source.quant),
                    tensor_dtypes=dtypes)


def ops(node: Node) -> list[list]:
    """[[operator, op pattern, [input dtypes]], ...] of a kernel, in the order it computes them."""
    return node.attributes.get("ops") or []


def names(node: Node) -> list[str]:
    return [op[0] for op in ops(node)]


def compute(node: Node) -> list | None:
    """The kernel's compute operator (conv2d, matmul...), None when it has none."""
    return next((op for op in ops(node) if op[1] == COMPUTE), None)


def precision(graph: Artifact) -> list[str]:
    """'quantized', 'float' or 'neutral' per kernel: a compute kernel is quantized when its compute operator reads
    integer data, float when it reads floats; kernels without a compute operator (layout, quantize, dequantize,
    elementwise) are neutral."""
    kinds = []
    for node in graph.nodes:
        op = compute(node)
        if op is None:
            kinds.append("neutral")
        else:
            data = (op[2] or [""])[0]
            kinds.append("quantized" if data.startswith(INTEGER) else "float")
    return kinds


def pattern_name(pattern: int) -> str:
    return PATTERNS.get(int(pattern), "unknown")
