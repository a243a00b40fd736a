"""Metrics over saved outputs: accuracy, drift against the FP32 reference, latency, cost.

Each module holds small functions over numpy arrays, computed in float64.
"""

from tiergate.metrics.accuracy import Estimate, accuracy, predictions
from tiergate.metrics.cost import cost_per_1k
from tiergate.metrics.drift import OutputDrift, compare_outputs, sqnr_db
from tiergate.metrics.latency import LatencyStats, latency_stats

__all__ = ["Estimate", "LatencyStats", "OutputDrift", "accuracy", "compare_outputs", "cost_per_1k",
           "latency_stats", "predictions", "sqnr_db"]
