"""The drift report's computations on data it is given: no registry, no I/O.

The registry side (tiergate.registry.report_data) reads the records and the stored
result folders and calls these; html.py renders the finished dict.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tiergate.metrics.drift import shared_drift

REPORT_SCHEMA = 1
MATRIX_KEYS = ("max_abs_error", "cosine", "sqnr_db")


def finite(value) -> float | None:
    """A real number as float; bools, non-numbers, NaN and infinities become None (the report's JSON is strict)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def pair_drift(a: dict[str, np.ndarray] | None, b: dict[str, np.ndarray] | None) -> dict[str, float | None] | None:
    """Worst agreement over the outputs both sides share with the same shape; None when none do."""
    if a is None or b is None:
        return None
    drifts = list(shared_drift(a, b).values())
    if not drifts:
        return None
    return {"max_abs_error": finite(max(d.max_abs_error for d in drifts)),
            "cosine": finite(min(d.cosine for d in drifts)), "sqnr_db": finite(min(d.sqnr_db for d in drifts))}


def cross_tier_matrix(labels: Sequence[dict], outputs: Sequence[dict[str, np.ndarray] | None]) -> dict:
    """Pairwise drift between columns: one label dict and one outputs dict (None: not available) per column.

    Returns {"max_abs_error": [[...]], "cosine": [[...]], "sqnr_db": [[...]], "labels": [...]}, each label
    given `has_outputs`; a cell is None where either side has no comparable outputs.
    """
    if len(labels) != len(outputs):
        raise ValueError(f"{len(labels)} labels for {len(outputs)} output sets")
    cells = [[pair_drift(a, b) for b in outputs] for a in outputs]
    return {key: [[cell[key] if cell else None for cell in row] for row in cells] for key in MATRIX_KEYS} | {
        "labels": [{**label, "has_outputs": o is not None} for label, o in zip(labels, outputs)]}
