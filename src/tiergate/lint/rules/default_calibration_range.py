"""default-calibration-range: activation quantization parameters that equal a default
range instead of calibrated statistics ((-6, 6) is what many toolchains give a tensor
they never calibrated), or one identical range shared by many activation tensors."""

from __future__ import annotations

import math
from collections import defaultdict

RULE = "default-calibration-range"
SEVERITY = "error"
DESCRIPTION = "quantization range equals a default (such as (-6, 6)) rather than calibration"

DEFAULT_RANGES = ((-6.0, 6.0),)
SAME_RANGE_MIN_TENSORS = 4       # this many activation tensors sharing one range ...
SAME_RANGE_MIN_SHARE = 0.5       # ... that are at least this share of all of them, is suspicious
_LEVELS = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}


def check(ctx) -> list:
    artifact = ctx.artifact
    activations = {name: q for name, q in artifact.quant.items()
                   if name not in artifact.initializers and len(q.scale) == 1 and q.dtype in _LEVELS}
    findings = []
    defaulted = sorted(name for name, q in activations.items() if _default_range(q))
    if defaulted:
        low, high = _default_range(activations[defaulted[0]])
        findings.append(ctx.finding(
            RULE, SEVERITY,
            f"{len(defaulted)} activation tensor(s) quantized over the default range "
            f"({low:g}, {high:g}) rather than a calibrated one: {_names(defaulted)}",
            _nodes_of(ctx, defaulted)))
    findings += _shared_ranges(ctx, activations, set(defaulted))
    return findings


def _range(q) -> tuple[float, float]:
    qmin, qmax = _LEVELS[q.dtype]
    scale, zero = q.scale[0], q.zero_point[0]
    return (qmin - zero) * scale, (qmax - zero) * scale


def _default_range(q) -> tuple[float, float] | None:
    """The default range the parameters encode (within one quantization step), if any."""
    low, high = _range(q)
    step = q.scale[0]
    for lo, hi in DEFAULT_RANGES:
        if math.isclose(low, lo, abs_tol=step) and math.isclose(high, hi, abs_tol=step):
            return lo, hi
    return None


def _shared_ranges(ctx, activations: dict, already: set[str]) -> list:
    groups: dict[tuple, list[str]] = defaultdict(list)
    for name, q in activations.items():
        groups[(q.dtype, q.scale[0], q.zero_point[0])].append(name)
    findings = []
    for (dtype, scale, zero), names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        names = sorted(set(names) - already)
        if len(names) >= SAME_RANGE_MIN_TENSORS and len(names) >= SAME_RANGE_MIN_SHARE * len(activations):
            findings.append(ctx.finding(
                RULE, "warning",
                f"{len(names)} of {len(activations)} activation tensors share one range "
                f"(scale {scale:.6g}, zero point {zero}): suspicious for calibrated data: {_names(names)}",
                _nodes_of(ctx, names)))
    return findings


def _nodes_of(ctx, tensors: list[str]) -> list[int]:
    wanted = set(tensors)
    return sorted({n.index for n in ctx.artifact.nodes if wanted & set(n.outputs)})


def _names(names: list[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
