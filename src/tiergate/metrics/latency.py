"""Latency statistics over per-call timings (nanoseconds, one per inference call)."""

from __future__ import annotations

import math

import numpy as np

from tiergate.figures import LatencyStats  # noqa: F401 - re-exported (stdlib-only type)


def p99_min_samples(confidence: float = 0.95) -> int:
    """Calls needed for the largest one to bound p99 from above with this confidence: 1 - 0.99^n >= c."""
    return math.ceil(math.log(1 - confidence) / math.log(0.99))


def latency_stats(latencies_ns, batch_size: int = 1, *, emulated: bool = False,
                  max_cov: float | None = 0.25, min_samples_p99: int = 299) -> LatencyStats | None:
    """Percentiles, mean, CoV and throughput of one run; None when it has no timings."""
    ms = np.asarray(latencies_ns, dtype=np.float64) / 1e6
    if ms.size == 0:
        return None
    mean = float(ms.mean())
    std = float(ms.std(ddof=1)) if ms.size > 1 else 0.0
    cov = std / mean if mean > 0 else float("inf")
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return LatencyStats(
        n_calls=int(ms.size), batch_size=batch_size, emulated=emulated,
        mean_ms=mean, std_ms=std, cov=cov, p50_ms=p50, p90_ms=p90, p99_ms=p99,
        p99_reliable=ms.size >= min_samples_p99,
        unstable=max_cov is not None and not cov <= max_cov,
        throughput_per_s=batch_size * 1000.0 / mean if mean > 0 else float("inf"),
    )
