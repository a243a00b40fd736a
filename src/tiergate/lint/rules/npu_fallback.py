"""npu-fallback: an operator an NPU tier's compiler leaves to the CPU (Arm's Vela on an Ethos-U class; docs/npu.md).

Needs the tier's runtime graph (inspect --target, a gate): Vela's record of the compile, each source operator's
placement with Vela's own reason. One warning per operator that falls back (the float interface of an integer model,
a QUANTIZE of a model input or a DEQUANTIZE to a model output, is on the CPU by construction: not a finding). The
gate's max_cpu_ops and min_npu_op_share decide on the same placement. Without the runtime graph: nothing.
"""

from __future__ import annotations

from dataclasses import replace

from tiergate.npu.placement import Placement, describe

RULE = "npu-fallback"
SEVERITY = "warning"
DESCRIPTION = "operators the NPU's compiler leaves to the CPU (Vela's placement, with its reason)"


def check(ctx) -> list:
    described = ctx.runtime
    if described is None or not described.ok or described.runtime != "ethos-u":
        return []
    placement = Placement.from_record(described.npu)
    if placement is None:
        return []
    version = described.versions.get("ethos-u-vela", "")
    findings = []
    by_index = {node.index: node for node in ctx.artifact.nodes}
    for op in placement.on_cpu:
        index = op.get("index")
        nodes = (index,) if index in by_index else ()
        message = (f"falls back to the CPU on {described.target} ({placement.accelerator}, Vela {version}): "
                   f"{describe(op)}")
        findings.append(replace(ctx.finding(RULE, SEVERITY, message, nodes), basis="runtime",
                                target=described.target))
    return findings
