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


# --- the binomial and normal figures from scipy.special: the same values scipy.stats gives --------------------


def test_exact_binomial_p_at_one_half_is_scipy_stats_binomtest():
    for n in [*range(0, 41), 97, 200, 401, 1000]:
        for k in sorted({*range(0, min(n, 40) + 1), *range(max(0, n - 5), n + 1), n // 2}):
            want = 1.0 if n == 0 else sps.binomtest(k, n, 0.5).pvalue
            assert stats.binom_half_two_sided(k, n) == pytest.approx(want, rel=1e-9, abs=1e-300), (k, n)


def test_the_median_interval_counts_are_scipy_stats_binom_cdf():
    for n in (1, 5, 6, 7, 50, 200, 1001):
        k = np.arange(n)
        np.testing.assert_allclose(stats.binom_half_cdf(k, n), sps.binom.cdf(k, n, 0.5), rtol=1e-10, atol=1e-300)
        for confidence in (0.9, 0.95, 0.99):     # the order statistic the interval picks is the same
            cut = (1 - confidence) / 2
            assert np.searchsorted(stats.binom_half_cdf(k, n), cut, side="right") == \
                np.searchsorted(sps.binom.cdf(k, n, 0.5), cut, side="right")


def test_normal_quantiles_are_scipy_stats_norm():
    q = np.array([1e-12, 1e-6, 0.0005, 0.005, 0.025, 0.05, 0.25, 0.5, 0.9])
    np.testing.assert_allclose(stats.norm_isf(q), sps.norm.isf(q), rtol=1e-12)
    x = np.array([-3.0, 0.0, 0.5, 1.96, 4.0, 9.0])
    np.testing.assert_allclose(stats.norm_sf(x), sps.norm.sf(x), rtol=1e-12)
    for t in (0.1, 0.25, 0.5, 0.9):
        norm = sps.norm
        assert stats.alpha_spent(t, 0.05) == pytest.approx(2 * norm.sf(norm.isf(0.025) / math.sqrt(t)), rel=1e-12)


def test_wilson_interval_is_scipy_stats_proportion_ci():
    from tiergate.metrics.accuracy import proportion

    for n in (1, 2, 9, 50, 400, 5000):
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            for confidence in (0.9, 0.95, 0.99):
                ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
                low, high = stats.wilson_interval(k, n, confidence)
                assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-12, abs=1e-15), (k, n, confidence)
                estimate = proportion(k, n, confidence)
                assert (estimate.low, estimate.high) == (low, high)


def test_a_top1_gate_decides_without_importing_scipy_stats(tmp_path):
    """The decision of a classifier gate (top-1, McNemar, paired intervals, Wilson) needs scipy.special only: its
    0.6-s import of scipy.stats is not paid (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from tiergate import stats\n"
        "from tiergate.metrics.accuracy import proportion\n"
        "rng = np.random.default_rng(0)\n"
        "a, b = rng.random(300) < 0.9, rng.random(300) < 0.8\n"
        "stats.mcnemar_exact(a, b); stats.paired_ratio(a, b); stats.accuracy_difference(a, b)\n"
        "proportion(int(a.sum()), a.size)\n"
        "stats.interleaved_latency_ratio(rng.random(50) + 1, rng.random(50) + 1); stats.alpha_spent(0.5, 0.05)\n"
        "print('scipy.stats' in sys.modules, 'scipy.special' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_which_decisions_bootstrap():
    from types import SimpleNamespace

    from tiergate.orchestrator.deciding import bootstraps
    from tiergate.outputs.kind import OutputKind

    scores = {"p": OutputKind("p", "class_scores")}
    two = {"candidate": None, "reference": None}
    top1, topk, cer = (SimpleNamespace(kind=kind) for kind in ("top1", "topk", "cer"))
    assert not bootstraps(SimpleNamespace(metrics=(top1, topk), intakes=two, kinds=scores))
    assert bootstraps(SimpleNamespace(metrics=(top1, cer), intakes=two, kinds=scores))        # a task metric
    assert bootstraps(SimpleNamespace(metrics=(), intakes={**two, "incumbent": None}, kinds=scores))
    assert bootstraps(SimpleNamespace(metrics=(), intakes=two, kinds={**scores, "b": OutputKind("b", "map")}))
