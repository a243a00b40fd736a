"""How a figure is written for people: one home, used by reasons, the CLI table, Markdown and the Prefect table."""

from __future__ import annotations

import math
import sys


def number(value, digits: int = 4, *, missing: str = "") -> str:
    """A figure in `digits` significant digits; NaN is "—", None is `missing`, anything else as str()."""
    if value is None:
        return missing
    if _is_float(value):
        return "—" if math.isnan(value) else f"{float(value):.{digits}g}"
    return str(value)


def rounded(value, digits: int = 6):
    """The same figure kept as a number (for tables that sort): floats rounded to `digits` significant digits."""
    if _is_float(value):
        return float(f"{float(value):.{digits}g}")
    return value if value is None or isinstance(value, (int, str)) else str(value)


def _is_float(value) -> bool:
    """A Python or numpy float (numpy is never imported here: when it is not loaded, no value is one of its)."""
    if isinstance(value, float):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.floating)
