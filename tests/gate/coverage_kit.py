"""Coverage of paired-proportion intervals: exact (every count of pairs enumerated with its multinomial
probability) and by simulation (multinomial draws). Used by tests/gate/test_paired_coverage.py and
bench/bench_paired_intervals.py.

A configuration: n samples, the reference right with probability p_ref, a discordance rate (samples on which
the two disagree) of which a share goes to "only the candidate right". Its true ratio is
(both + only_c) / (both + only_r), its true difference only_c - only_r.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from tiergate import stats


@dataclass(frozen=True)
class Config:
    n: int
    p_ref: float
    rate: float           # discordance rate
    share: float          # of the discordant samples, the share only the candidate gets right

    @property
    def cells(self) -> tuple[float, float, float, float] | None:
        """(both, only_c, only_r, neither) probabilities, or None when p_ref and the rate do not fit."""
        only_c, only_r = self.rate * self.share, self.rate * (1 - self.share)
        both = self.p_ref - only_r
        neither = 1 - both - only_c - only_r
        return None if both < 0 or neither < -1e-12 else (both, only_c, only_r, max(neither, 0.0))

    def truth(self, kind: str) -> float:
        both, only_c, only_r, _ = self.cells
        return (both + only_c) / (both + only_r) if kind == "ratio" else only_c - only_r


def enumerate_counts(config: Config, tol: float = 1e-8):
    """Every (both, only_c, only_r) count with probability above the tails, and its probability."""
    n = config.n
    both_p, c_p, r_p, neither_p = config.cells
    kc = int(sps.binom.isf(tol, n, c_p)) + 1 if c_p > 0 else 0
    kr = int(sps.binom.isf(tol, n, r_p)) + 1 if r_p > 0 else 0
    a, b = (g.ravel() for g in np.meshgrid(np.arange(kc + 1), np.arange(kr + 1), indexing="ij"))
    rest = n - a - b
    p_ab = sps.multinomial.pmf(np.stack([a, b, rest], 1), n, [c_p, r_p, 1 - c_p - r_p])
    keep = (rest >= 0) & (p_ab > tol / 100)
    share_both = both_p / (both_p + neither_p) if both_p + neither_p > 0 else 0.0
    parts = []
    for ai, bi, ri, pi in zip(a[keep], b[keep], rest[keep], p_ab[keep]):
        lo, hi = int(sps.binom.ppf(tol, ri, share_both)), int(sps.binom.isf(tol, ri, share_both))
        both = np.arange(max(lo, 0), min(hi, ri) + 1)
        parts.append((both, np.full(both.shape, ai), np.full(both.shape, bi), pi * sps.binom.pmf(both, ri, share_both)))
    both, only_c, only_r, prob = (np.concatenate(column) for column in zip(*parts))
    return both, only_c, only_r, prob


def exact_coverage(config: Config, kind: str = "ratio", confidence: float = 0.95) -> float:
    """The probability that tiergate's interval covers the truth, summed over the enumerated counts."""
    both, only_c, only_r, prob = enumerate_counts(config)
    _, low, high = stats.paired_bounds(kind, both, only_c, only_r, np.full(both.shape, config.n), confidence)
    return float(np.sum(prob * _covers(config.truth(kind), low, high)) / np.sum(prob))


def draw_counts(config: Config, draws: int, rng: np.random.Generator):
    counts = rng.multinomial(config.n, config.cells, size=draws)
    return counts[:, 0], counts[:, 1], counts[:, 2]


def simulated_coverage(config: Config, draws: int, seed: int = 0, kind: str = "ratio",
                       confidence: float = 0.95) -> float:
    """The share of simulated data sets whose interval covers the truth."""
    both, only_c, only_r = draw_counts(config, draws, np.random.default_rng(seed))
    _, low, high = stats.paired_bounds(kind, both, only_c, only_r, np.full(both.shape, config.n), confidence)
    return float(np.mean(_covers(config.truth(kind), low, high)))


def bootstrap_coverage(config: Config, draws: int, seed: int = 0, n_resamples: int = 9999,
                       confidence: float = 0.95) -> float:
    """The same simulation with the method the gate used before (stats.metric_ratio on the hits: a paired
    bootstrap, BCa, with the exact zero-event bound when nothing differs); one interval per distinct count."""
    both, only_c, only_r = draw_counts(config, draws, np.random.default_rng(seed))
    truth, seen, covered = config.truth("ratio"), {}, 0
    for key in zip(both.tolist(), only_c.tolist(), only_r.tolist()):
        if key not in seen:
            cand, ref = _hits(config.n, *key)
            interval = stats.metric_ratio(cand[None], ref[None], _mean_row0, confidence=confidence,
                                          n_resamples=n_resamples, seed=0)
            seen[key] = bool(_covers(truth, interval.low, interval.high))
        covered += seen[key]
    return covered / draws


def _hits(n: int, both: int, only_c: int, only_r: int) -> tuple[np.ndarray, np.ndarray]:
    cand, ref = np.zeros(n), np.zeros(n)
    cand[:both + only_c] = 1
    ref[:both] = 1
    ref[both + only_c:both + only_c + only_r] = 1
    return cand, ref


def _mean_row0(c, axis=-1):
    return np.mean(c[0], axis=axis)


def _covers(truth, low, high):
    scale = max(abs(truth), 1.0)
    return (np.asarray(low) <= truth + 1e-12 * scale) & (truth - 1e-12 * scale <= np.asarray(high))


GRID_N = (100, 300, 1000)
GRID_RATE = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05)
GRID_SHARE = (0.0, 0.25, 0.5, 0.75, 1.0)


def grid(p_ref: float = 0.9):
    for n in GRID_N:
        for rate in GRID_RATE:
            for share in GRID_SHARE if rate > 0 else (0.5,):
                config = Config(n, p_ref, rate, share)
                if config.cells is not None:
                    yield config
