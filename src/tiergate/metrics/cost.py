"""Cost per 1,000 inferences from a device class's price and measured throughput."""

from __future__ import annotations

import math


def cost_per_1k(cost_per_hour: float, throughput_per_s: float) -> float:
    """Price of 1,000 inferences at single-stream throughput (inferences per second)."""
    if not throughput_per_s > 0 or math.isinf(throughput_per_s):
        return float("nan")
    return cost_per_hour / 3600.0 * 1000.0 / throughput_per_s
