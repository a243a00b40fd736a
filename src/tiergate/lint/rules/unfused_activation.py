"""unfused-activation: a no-op (Identity, Dropout, a same-shape Reshape...) between a
normalization / conv / gemm and its activation stops the runtime fusing the pair.
In TFLite an activation that stays a separate op after a producer that could
carry it as fused_activation_function is flagged too."""

from __future__ import annotations

RULE = "unfused-activation"
SEVERITY = "warning"
DESCRIPTION = "no-op between conv/norm/gemm and its activation breaks fusion"

PRODUCERS = {
    "Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "InstanceNormalization",
    "LayerNormalization", "GroupNormalization", "QLinearConv",
    "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "CONV_3D", "ADD", "MUL",
}
ACTIVATIONS = {
    "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "PRelu", "Elu", "Selu",
    "Gelu", "Softplus", "Mish", "Swish",
    "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "TANH", "LEAKY_RELU", "LOGISTIC", "HARD_SWISH",
    "PRELU", "ELU", "GELU",
}
ONNX_NOOPS = {"Identity", "Dropout"}
# activations TFLite can fuse into the producer (ActivationFunctionType)
TFLITE_FUSABLE = {"RELU", "RELU6", "RELU_N1_TO_1", "TANH"}


def check(ctx) -> list:
    findings = []
    nodes = ctx.artifact.nodes
    for node in nodes:
        if node.op not in PRODUCERS or node.op in ("ADD", "MUL"):
            continue
        chain = _noop_chain(ctx, node)
        if chain is None:
            continue
        noops, activation = chain
        if noops:
            ops = " -> ".join(nodes[i].op for i in noops)
            findings.append(ctx.file_finding(
                RULE, SEVERITY,
                f"{node.op} -> {ops} -> {activation.op}: the no-op between them stops "
                f"{node.op}+{activation.op} fusing; remove it",
                [node.index, *noops, activation.index]))
        elif _tflite_unfused(ctx, node, activation):
            delegated = _both_delegated(ctx, node, activation)
            findings.append(ctx.file_finding(
                RULE, "info" if delegated else SEVERITY,
                f"{node.op} -> {activation.op}: the activation is a separate op although {node.op} "
                f"could carry it as fused_activation_function"
                + ("; the XNNPACK delegate takes both and fuses the clamp into its producer" if delegated else ""),
                [node.index, activation.index]))
    return findings


def _noop_chain(ctx, node):
    """The no-ops after `node` and the activation they lead to, when each link has one reader."""
    noops = []
    current = node
    while True:
        nxt = ctx.index.sole_consumer(current)
        if nxt is None:
            return None
        candidate = ctx.artifact.nodes[nxt]
        if candidate.op in ACTIVATIONS:
            return noops, candidate
        if not _is_noop(ctx, candidate):
            return None
        noops.append(nxt)
        current = candidate


def _is_noop(ctx, node) -> bool:
    if node.op in ONNX_NOOPS:
        return True
    if node.op in ("RESHAPE", "Reshape", "CAST", "Cast") and node.inputs and node.outputs:
        return _same_tensor_type(ctx.artifact, node.inputs[0], node.outputs[0])
    return False


def _same_tensor_type(artifact, a: str, b: str) -> bool:
    dtypes = artifact.tensor_dtypes
    if dtypes.get(a) is None or dtypes.get(a) != dtypes.get(b):
        return False
    shapes = getattr(artifact.handle, "shapes", None)
    return shapes is None or shapes.get(a) == shapes.get(b)


def _both_delegated(ctx, node, activation) -> bool:
    """On the tier's LiteRT (runtime graph known): both nodes went to the XNNPACK delegate."""
    if ctx.basis != "runtime" or ctx.runtime is None:
        return False
    placed = {index: where for index, _, where in ctx.runtime.nodes}
    return placed.get(node.index) == placed.get(activation.index) == "xnnpack"


def _tflite_unfused(ctx, node, activation) -> bool:
    return (ctx.artifact.format == "tflite" and activation.op in TFLITE_FUSABLE
            and node.attributes.get("fused_activation_function") == "NONE")
