"""unfolded-batchnorm: a Conv followed by BatchNormalization left in an inference graph
(TFLite: a conv followed by a MUL, and optionally ADD, with constant per-channel operands),
where the normalization should have been folded into the conv's weights and bias."""

from __future__ import annotations

RULE = "unfolded-batchnorm"
SEVERITY = "warning"
DESCRIPTION = "Conv followed by BatchNormalization not folded for inference"

CONVS = {"Conv", "ConvTranspose", "QLinearConv", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV"}


def check(ctx) -> list:
    findings = []
    nodes = ctx.artifact.nodes
    for node in nodes:
        if node.op not in CONVS:
            continue
        nxt = ctx.index.sole_consumer(node)
        if nxt is None:
            continue
        follower = nodes[nxt]
        if follower.op == "BatchNormalization" and follower.inputs[:1] == node.outputs[:1]:
            pointed = [node.index, nxt]
        elif follower.op == "MUL" and _constant_operand(ctx, follower):
            pointed = [node.index, nxt] + _constant_add_after(ctx, follower)
        else:
            continue
        findings.append(ctx.file_finding(
            RULE, SEVERITY,
            f"{node.op} -> {' -> '.join(nodes[i].op for i in pointed[1:])}: batch normalization is not "
            f"folded into the convolution (an extra pass over the activations at inference)",
            pointed))
    return findings


def _constant_operand(ctx, node) -> bool:
    return any(t in ctx.artifact.initializers for t in node.inputs)


def _constant_add_after(ctx, node) -> list[int]:
    nxt = ctx.index.sole_consumer(node)
    if nxt is not None and ctx.artifact.nodes[nxt].op == "ADD" and _constant_operand(ctx, ctx.artifact.nodes[nxt]):
        return [nxt]
    return []
