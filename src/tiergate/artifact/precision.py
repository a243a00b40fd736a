"""An artifact's precision, and the one rule every path applies to an FP32 reference: it is not quantized.

`tiergate register` (registry.intake), every gate (orchestrator.intake: the CLI, flows, explain's fixes, bisect)
and an MLflow reference (mlflow_bridge.fetch_values, naming the models:/ URI) call `check_reference`: a reference
that is quantized (Q/DQ or quantized tensors) or whose weights are mostly integers is refused (exit 2), so that an
INT8 model promoted to an alias is never taken as the next gate's FP32 reference and losses never compound.
"""

from __future__ import annotations

import math
from collections import Counter

from tiergate.errors import InputError

_PRECISION = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
              "int8": "int8", "uint8": "uint8", "int4": "int4", "uint4": "uint4", "int16": "int16"}


def precision_of(artifact) -> str:
    """'int8', 'uint8', 'fp16', 'fp32'...: the quantized tensors' type, else the type holding most weight elements."""
    if artifact.quant:
        fixed = [q for q in artifact.quant.values() if q.scale] or list(artifact.quant.values())
        dtype = Counter(q.dtype for q in fixed).most_common(1)[0][0]     # (dynamic quantization's run-time
        return _PRECISION.get(dtype, dtype)                             # activations have no type of their own)
    elements: Counter = Counter()
    for shape, dtype in artifact.initializers.values():
        if dtype in _PRECISION:
            elements[_PRECISION[dtype]] += math.prod(d for d in shape if isinstance(d, int)) if shape else 1
    return elements.most_common(1)[0][0] if elements else "fp32"


def is_float(precision: str) -> bool:
    return precision.startswith(("fp", "bf"))


def check_reference(artifact, label=None) -> None:
    """InputError (exit 2) naming the reference when it is quantized: the gate measures losses against it."""
    precision = precision_of(artifact)
    if artifact.is_quantized or not is_float(precision):
        raise InputError(f"{label or artifact.path}: the reference is quantized ({precision}); give the FP32 model "
                         "(a quantized reference hides the candidate's losses, and they compound release after "
                         "release)")
