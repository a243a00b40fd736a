"""unfused-activation: a no-op (Identity, Dropout, a same-shape Reshape...) between a
normalization / conv / gemm and its activation stops the runtime fusing the pair.
In TFLite an activation that stays a separate op after a producer that could
carry it as fused_activation_function is flagged too. On a compiled tier (TVM's
lowered graph, tiergate.lint.kernels) an activation whose kernel holds no producer
of its own, read from a conv/norm/matmul kernel, is flagged with why FuseOps left
them apart (an Identity the frontend dropped is no finding there)."""

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
    if ctx.artifact.format == "tvm":
        return _lowered(ctx)
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


def _lowered(ctx) -> list:
    """TVM's kernels: an activation computed in a kernel apart from the producer it follows."""
    from tiergate.lint import kernels

    findings = []
    nodes = ctx.artifact.nodes
    for node in nodes:
        producer = _producer(kernels, node)
        after = ctx.index.sole_consumer(node)
        if producer is None or after is None:
            continue
        ops = kernels.ops(nodes[after])
        first = next((i for i, op in enumerate(ops) if op[0] in kernels.ACTIVATIONS), None)
        if first is None or any(op[1] == kernels.COMPUTE or op[0] in kernels.NORMALIZATIONS for op in ops[:first]):
            continue           # no activation, or one fused with a producer of its own kernel
        activation = ops[first][0]
        findings.append(ctx.finding(
            RULE, SEVERITY,
            f"{node.op} -> {nodes[after].op}: {activation} runs in a kernel apart from {producer}, an extra pass "
            f"over its output; {_why(ctx, kernels, producer, ops[0])}", [node.index, after]))
    return findings


def _producer(kernels, node) -> str | None:
    """The conv/norm/matmul a kernel ends its arithmetic with, None when it has none or already activates."""
    names = kernels.names(node)
    if any(name in kernels.ACTIVATIONS for name in names):
        return None
    heavy = [op[0] for op in kernels.ops(node) if op[1] == kernels.COMPUTE or op[0] in kernels.NORMALIZATIONS]
    return heavy[-1] if heavy else None


def _why(ctx, kernels, producer: str, first: list) -> str:
    runtime = ctx.runtime
    if "FuseOps" in (getattr(runtime, "disabled", None) or []):
        return "FuseOps is switched off on this tier (disabled_passes)"
    if (getattr(runtime, "compile", None) or {}).get("kernels_after") != "FuseOps":
        return "FuseOps did not run"
    if first[1] > kernels.FUSABLE_AFTER_COMPUTE:
        return (f"{first[0]} ({kernels.pattern_name(first[1])}) comes first, and FuseOps fuses only elementwise and "
                f"broadcast operators into a {producer} kernel")
    return "FuseOps left them apart"
