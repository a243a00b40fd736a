"""provider-fallback: nodes that onnxruntime placed on the CPU although the device class asks
for an accelerator's execution provider (CUDA), read from the provider assignment the tier's
runtime made in its container. Needs the runtime graph (--target): without it, nothing. Names every node
left to the CPU (the runtime's own names, and their positions in the graph the tier runs where it has them)."""

from __future__ import annotations

from collections import Counter

RULE = "provider-fallback"
SEVERITY = "warning"
DESCRIPTION = "nodes the accelerator's execution provider left to the CPU (from the tier's runtime)"

ACCELERATOR = {"onnxruntime-gpu": "CUDAExecutionProvider"}


def check(ctx) -> list:
    described = ctx.runtime
    if described is None or not described.ok or described.runtime not in ACCELERATOR:
        return []
    wanted = ACCELERATOR[described.runtime]
    where = f"{described.target}, {described.machine}"
    if wanted not in described.providers:
        return [_finding(ctx, "warning", f"{wanted} is not available in the runtime on {where} "
                                         f"(providers: {', '.join(described.providers)}): every node runs on the CPU")]
    fallen = [(name, op) for name, op, ep in described.nodes if ep != wanted]
    if not fallen:
        return []
    ops = ", ".join(f"{op} x{n}" for op, n in Counter(op for _, op in fallen).most_common())
    return [_finding(ctx, SEVERITY, f"{len(fallen)} node(s) fall back from {wanted} to the CPU on {where} "
                                    f"({ops}): host-device copies around them", [name for name, _ in fallen])]


def _finding(ctx, severity: str, message: str, names: list[str] = ()):
    """A finding of the tier's runtime; the nodes by the runtime's names, with their positions in the judged graph
    when every one of them is there."""
    from dataclasses import replace

    finding = replace(ctx.finding(RULE, severity, message), basis="runtime", target=ctx.runtime.target)
    if not names:
        return finding
    position = {node.name: node.index for node in ctx.artifact.nodes}
    nodes = tuple(position[name] for name in names) if all(name in position for name in names) else ()
    return replace(finding, nodes=nodes, node_names=tuple(names))
