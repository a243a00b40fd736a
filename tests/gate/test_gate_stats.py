"""A/B statistics against independent computations (paired proportions: tests/gate/test_paired_intervals.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from tiergate import stats


def exact_mcnemar(b: int, c: int) -> float:
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def numpy_percentile_bootstrap(a, b, statistic, confidence, n_resamples, seed):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), (n_resamples, len(a)))
    values = statistic(a[idx], b[idx])
    alpha = (1 - confidence) / 2
    return np.quantile(values, alpha), np.quantile(values, 1 - alpha)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_mcnemar_is_the_exact_binomial_test(seed):
    rng = np.random.default_rng(seed)
    a = rng.random(300) < 0.90
    b = np.where(rng.random(300) < 0.15, ~a, a)          # about 45 discordant pairs
    result = stats.mcnemar_exact(a, b)
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    assert (result.only_a, result.only_b, result.n) == (only_a, only_b, 300)
    assert result.p_value == pytest.approx(exact_mcnemar(only_a, only_b), rel=1e-9)
    assert result.p_value == pytest.approx(min(1, 2 * sps.binom.cdf(min(only_a, only_b), only_a + only_b, 0.5)))


def test_mcnemar_detects_a_real_difference_and_no_difference():
    a = np.ones(200, bool)
    b = a.copy()
    b[:30] = False
    assert stats.mcnemar_exact(a, b).p_value == pytest.approx(2 * 0.5 ** 30)
    assert stats.mcnemar_exact(a, a).p_value == 1.0


@pytest.mark.parametrize("seed", [0, 1])
def test_accuracy_difference_interval(seed):
    """Tango's score interval on the discordant pairs: around the observed difference, and at least as wide as
    the normal approximation (which ignores that few discordant pairs were seen); close to it with many."""
    rng = np.random.default_rng(seed)
    a = rng.random(800) < 0.92
    b = np.where(rng.random(800) < 0.1, rng.random(800) < 0.85, a)
    ci = stats.accuracy_difference(a, b, confidence=0.95)
    diff = a.astype(float) - b.astype(float)
    assert ci.estimate == pytest.approx(diff.mean()) and ci.method == "score-difference-paired"
    assert ci.low < ci.estimate < ci.high
    half = sps.norm.ppf(0.975) * diff.std(ddof=1) / math.sqrt(len(diff))   # normal approximation
    assert half < (ci.high - ci.low) / 2 < 1.3 * half
    big_a, big_b = np.tile(a, 25), np.tile(b, 25)
    big = stats.accuracy_difference(big_a, big_b)
    assert (big.high - big.low) / 2 == pytest.approx(half / 5, rel=0.03)


def test_identical_correctness_is_not_certainty():
    a = np.random.default_rng(0).random(100) < 0.8
    ci = stats.accuracy_difference(a, a)
    assert ci.estimate == 0.0 and ci.low < 0.0 < ci.high and ci.low == pytest.approx(-ci.high)
    assert ci.low > -0.1


def test_latency_ratio_interval_paired_and_unpaired():
    rng = np.random.default_rng(5)
    per_call = rng.lognormal(0, 0.3, 600)                     # shared per-sample cost: pairing helps
    a = per_call * 1.2 * rng.lognormal(0, 0.05, 600)
    b = per_call * rng.lognormal(0, 0.05, 600)
    paired = stats.latency_ratio(a, b, n_resamples=3000, seed=1)
    assert paired.estimate == pytest.approx(a.mean() / b.mean())
    assert paired.low < 1.2 < paired.high          # the true ratio of the means, E[a] / E[b], is 1.2
    low, high = numpy_percentile_bootstrap(a, b, lambda x, y: x.mean(axis=1) / y.mean(axis=1), 0.95, 3000, 2)
    assert paired.low == pytest.approx(low, rel=0.01) and paired.high == pytest.approx(high, rel=0.01)
    unpaired = stats.latency_ratio(a, b[:500], n_resamples=3000, seed=1)
    assert unpaired.low < unpaired.estimate < unpaired.high
    assert unpaired.high - unpaired.low > 2 * (paired.high - paired.low)   # pairing removes shared variance


def test_bootstrap_is_reproducible_by_seed():
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(0, 0.3, 300), rng.lognormal(0, 0.3, 300)
    assert stats.latency_ratio(a, b, seed=4) == stats.latency_ratio(a, b, seed=4)
    assert stats.latency_ratio(a, b, seed=4) != stats.latency_ratio(a, b, seed=5)


def test_non_inferiority_reads_the_lower_bound():
    ci = stats.Interval(estimate=0.0, low=-0.008, high=0.01, confidence=0.95, method="x")
    assert stats.noninferior(ci, margin=0.01)
    assert not stats.noninferior(ci, margin=0.005)


def test_unpaired_lengths_are_refused_for_correctness():
    with pytest.raises(ValueError, match="differ in length"):
        stats.mcnemar_exact([True, False], [True])


def test_large_samples_use_the_percentile_method_and_agree_with_bca(monkeypatch):
    rng = np.random.default_rng(8)
    per_call = rng.lognormal(0, 0.3, 3000)
    a, b = per_call * rng.lognormal(0, 0.05, 3000), per_call * rng.lognormal(0, 0.05, 3000)
    bca = stats.latency_ratio(a, b, n_resamples=3000, seed=2)
    monkeypatch.setattr(stats, "BCA_MAX_SAMPLES", 1000)
    percentile = stats.latency_ratio(a, b, n_resamples=3000, seed=2)
    assert (bca.method, percentile.method) == ("bootstrap-BCa", "bootstrap-percentile")
    assert percentile.low == pytest.approx(bca.low, abs=0.003) and percentile.high == pytest.approx(bca.high, abs=0.003)


def test_no_disagreement_is_bounded_by_the_sample_count_not_certain():
    """n identical 0/1 results: the ratio's interval is the exact zero-events bound, so 20 samples cannot
    clear a 0.99 threshold while 400 can (u = 1 - 0.025^(1/n))."""
    import numpy as np

    from tiergate.stats import metric_ratio

    def mean_row0(c, axis=-1):
        return np.mean(c[0], axis=axis)

    for n, clears in ((20, False), (400, True)):
        hits = np.ones((1, n))
        interval = metric_ratio(hits, hits.copy(), mean_row0)
        u = 1 - 0.025 ** (1 / n)
        assert interval.method == "exact-no-disagreement" and interval.estimate == 1.0
        assert interval.low == pytest.approx(1 - u) and interval.high == 1.0
        assert (interval.low > 0.99) is clears
