"""Score intervals for paired proportions (tiergate.stats.paired_interval), checked against independent
computations: the restricted maximum-likelihood estimate found numerically (scipy.optimize) instead of the
closed form, Wald intervals where they are valid, and the properties the gate relies on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from tiergate import stats
from tiergate.gate import evaluate
from tiergate.policy import load_policy
from tiergate.stats import PairCounts, paired_interval

Z95 = sps.norm.isf(0.025)


def _restricted_cells(counts: PairCounts, kind: str, value: float) -> np.ndarray:
    """The multinomial cells (both, only a, only b, neither) of greatest likelihood under p_a / p_b = value (or
    p_a - p_b = value), found numerically."""
    x = np.array([counts.both, counts.only_a, counts.only_b, counts.n - counts.both - counts.only_a - counts.only_b])

    def constraint(q):
        return (q[0] + q[1]) - value * (q[0] + q[2]) if kind == "ratio" else (q[1] - q[2]) - value

    def nll(q):
        return -float(np.sum(np.where(x > 0, x * np.log(np.maximum(q, 1e-300)), 0.0)))

    best = None
    for start in (np.full(4, 0.25), (x + 0.5) / (x.sum() + 2)):
        res = optimize.minimize(nll, start, method="SLSQP", bounds=[(1e-12, 1)] * 4, options={"ftol": 1e-15,
                                "maxiter": 1000}, constraints=[{"type": "eq", "fun": lambda q: q.sum() - 1},
                                                               {"type": "eq", "fun": constraint}])
        if best is None or res.fun < best.fun:
            best = res
    return best.x


def _independent_z(counts: PairCounts, kind: str, value: float) -> float:
    q11, q10, q01, _ = _restricted_cells(counts, kind, value)
    if kind == "ratio":
        d = (counts.both + counts.only_a) - value * (counts.both + counts.only_b)
        var = counts.n * (q10 + (1 - value) ** 2 * q11 + value ** 2 * q01)
    else:
        d = counts.only_a - counts.only_b - counts.n * value
        var = counts.n * (q10 + q01 - value ** 2)
    d = math.copysign(max(abs(d) - stats.CONTINUITY, 0.0), d)
    return d / math.sqrt(var)


CASES = [PairCounts(331, 1, 0, 335), PairCounts(180, 12, 5, 200), PairCounts(70, 3, 9, 100),
         PairCounts(850, 40, 25, 1000)]


@pytest.mark.parametrize("counts", CASES, ids=lambda c: f"{c.both}-{c.only_a}-{c.only_b}-{c.n}")
@pytest.mark.parametrize("kind", ["ratio", "difference"])
def test_the_bounds_are_where_the_score_statistic_reaches_z(counts, kind):
    interval = paired_interval(counts, kind)
    assert interval.low < interval.estimate < interval.high
    assert _independent_z(counts, kind, interval.low) == pytest.approx(Z95, abs=2e-3)
    assert _independent_z(counts, kind, interval.high) == pytest.approx(-Z95, abs=2e-3)


@pytest.mark.parametrize("kind", ["ratio", "difference"])
def test_many_discordant_pairs_agree_with_the_wald_interval(kind):
    counts = PairCounts(16_000, 1_200, 1_000, 20_000)
    interval = paired_interval(counts, kind)
    a, b = np.zeros(20_000), np.zeros(20_000)
    a[:17_200], b[:16_000], b[17_200:18_200] = 1, 1, 1
    if kind == "difference":
        d = a - b
        half = Z95 * d.std(ddof=1) / math.sqrt(len(d))
        centre = d.mean()
    else:                      # delta method for log(mean a / mean b)
        ma, mb = a.mean(), b.mean()
        cov = np.cov(a, b)
        se = math.sqrt(cov[0, 0] / ma ** 2 + cov[1, 1] / mb ** 2 - 2 * cov[0, 1] / (ma * mb)) / math.sqrt(len(a))
        half, centre = ma / mb * Z95 * se, ma / mb
    assert interval.estimate == pytest.approx(centre)
    assert (interval.high - interval.low) / 2 == pytest.approx(half, rel=0.03)


def test_one_favourable_discordance_does_not_give_a_lower_bound_of_one():
    """The classifier's case: 335 samples, one only the candidate gets right, none the other way."""
    one = paired_interval(PairCounts(331, 1, 0, 335), "ratio")
    none = paired_interval(PairCounts(332, 0, 0, 335), "ratio")
    assert one.low < 0.99 < 1.0 < one.high and none.low < 0.99
    assert one.high - one.low >= none.high - none.low


@pytest.mark.parametrize("kind", ["ratio", "difference"])
@pytest.mark.parametrize("n", [20, 100, 335, 1000])
def test_moving_a_sample_from_both_right_to_only_the_candidate_never_narrows_it(kind, n):
    both, only_a, only_b = np.meshgrid(np.arange(1, n + 1, max(1, n // 40)), np.arange(0, 10), np.arange(0, 10),
                                       indexing="ij")
    keep = both + only_a + only_b <= n
    both, only_a, only_b = both[keep], only_a[keep], only_b[keep]
    _, low0, high0 = stats.paired_bounds(kind, both, only_a, only_b, np.full(both.shape, n))
    _, low1, high1 = stats.paired_bounds(kind, both - 1, only_a + 1, only_b, np.full(both.shape, n))
    assert both.size > 100
    assert np.all((high1 - low1) >= (high0 - low0) - 1e-9)


def test_identical_answers_are_not_certainty_and_tighten_as_one_over_n():
    widths = []
    for n in (100, 1000, 10_000):
        ratio = paired_interval(PairCounts(int(0.9 * n), 0, 0, n), "ratio")
        diff = paired_interval(PairCounts(int(0.9 * n), 0, 0, n), "difference")
        assert ratio.low < 1.0 == ratio.estimate < ratio.high and diff.low < 0.0 == diff.estimate < diff.high
        widths.append(ratio.high - ratio.low)
    assert widths[0] / widths[1] == pytest.approx(10, rel=0.1) and widths[1] / widths[2] == pytest.approx(10, rel=0.1)


def test_samples_needed_scales_the_observed_pairs():
    """n' is the least sample count at which the same shares of pairs decide: checked on both sides of it."""
    for counts in (PairCounts(332, 0, 0, 335), PairCounts(331, 1, 0, 335), PairCounts(280, 6, 9, 300)):
        needed = stats.paired_samples_needed(counts, "ratio", ">=", 0.99, 0.95)
        assert needed > counts.n

        def scaled(m):
            f = m / counts.n
            return paired_interval(PairCounts(counts.both * f, counts.only_a * f, counts.only_b * f, m), "ratio")
        assert stats.judge(scaled(needed), ">=", 0.99) != stats.INCONCLUSIVE
        assert stats.judge(scaled(needed - 1), ">=", 0.99) == stats.INCONCLUSIVE
    assert stats.paired_samples_needed(PairCounts(300, 0, 0, 300), "ratio", ">=", 1.0, 0.95) is None


def _probs(right: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Class scores whose top-1 is the label where `right`, the next class otherwise."""
    top = np.where(right, labels, (labels + 1) % 4)
    out = np.full((len(labels), 4), 0.1, np.float32)
    out[np.arange(len(labels)), top] = 0.7
    return out


def test_the_gate_keeps_one_favourable_discordance_inconclusive(make_outcome, device_classes):
    """335 samples, FP32 right on 331, the candidate on the same 331 and one more: INCONCLUSIVE at 0.99, with
    the samples that would decide; the same with no discordance at all."""
    labels = np.arange(335) % 4
    ref_right = np.ones(335, bool)
    ref_right[:4] = False
    cand_right = ref_right.copy()
    cand_right[0] = True
    policy = load_policy(None)
    for cand in (cand_right, ref_right):
        decision = evaluate({"x86": make_outcome("x86", {"probs": _probs(cand, labels)})},
                            {"x86": make_outcome("x86", {"probs": _probs(ref_right, labels)})},
                            device_classes, policy, labels)
        (check,) = [c for c in decision.checks if c.name == "accuracy_ratio"]
        assert check.interval.method == "score-ratio-paired" and check.interval.low < 0.99
        assert check.inconclusive and not check.passed and check.samples_needed > 335
        assert decision.verdict == "INCONCLUSIVE"
