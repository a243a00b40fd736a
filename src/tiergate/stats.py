"""A/B statistics on the same samples: exact McNemar, score intervals for paired proportions, and paired
bootstrap intervals for every other statistic (scipy.stats).

The gate asks non-inferiority questions ("is the candidate no worse than the
incumbent by more than a margin?"), answered from the confidence intervals
here; the McNemar p-value is reported alongside ("do they differ at all?").

Paired proportions (top-1 / top-k accuracy of a candidate and its reference on the same samples) are judged
on the discordant pairs with score intervals: the ratio p_c / p_r by the score test of Tang, Tang & Chan
(2003) (the ratio of two correlated proportions; also Nam & Blackwelder 2002), the difference p_a - p_b by
Tango's (1998), both inverted with a continuity correction of half a pair. A bootstrap cannot see
disagreements it never observed (one favourable discordance and none against gives it a lower bound of
exactly 1); these intervals can, they are exact enough at any count (coverage checked by exact enumeration
in tests/gate/test_paired_coverage.py and bench/bench_paired_intervals.py), and deterministic.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np

from tiergate.figures import SPENDING, Interval, Look, McNemar  # noqa: F401 - re-exported (stdlib-only)


def _scipy_stats():
    """scipy.stats, imported on first use (0.6 s at start-up, most of it its distributions' docstrings): for the
    bootstrap (and rankdata) only."""
    from scipy import stats

    return stats


def _special():
    """scipy.special (0.15 s to import): the binomial and normal functions the paired intervals, the exact McNemar
    test, the Wilson interval and alpha spending need, from the same routines scipy.stats calls for them."""
    from scipy import special

    return special


def binom_half_cdf(k, n):
    """P(X <= k) for X ~ Binomial(n, 1/2) (scipy.stats.binom.cdf(k, n, 0.5)), vectorised over k."""
    return _special().bdtr(k, n, 0.5)


def norm_isf(q):
    """z with P(Z > z) = q for a standard normal Z (scipy.stats.norm.isf)."""
    return -_special().ndtri(q)


def norm_sf(x):
    """P(Z > x) for a standard normal Z (scipy.stats.norm.sf)."""
    return _special().ndtr(-x)


def binom_half_two_sided(k: int, n: int) -> float:
    """The exact two-sided p-value of k successes in n trials at p = 1/2 (scipy.stats.binomtest(k, n, 0.5).pvalue):
    the distribution is symmetric, so the outcomes as likely as k or less are those as far from n/2 or farther."""
    if n == 0 or 2 * k == n:
        return 1.0
    return float(min(1.0, 2.0 * binom_half_cdf(min(k, n - k), n)))


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of k / n, two-sided, without continuity correction: Newcombe (1998), as
    scipy.stats.binomtest(k, n).proportion_ci(confidence, method="wilson") computes it (0 and 1 where k is 0 or n)."""
    p, z = k / n, float(norm_isf((1.0 - confidence) / 2.0))
    denom = 2 * (n + z ** 2)
    center = (2 * n * p + z ** 2) / denom
    delta = z / denom * math.sqrt(4 * n * p * (1 - p) + z ** 2)
    return (0.0 if k == 0 else center - delta), (1.0 if k == n else center + delta)


_IMPORTING: set = set()


def import_in_background(bootstrap: bool = True) -> None:
    """Import what a gate's decision needs on a thread of its own (once per process), while its other containers
    run: scipy.special, and scipy.stats where the decision bootstraps (`bootstrap`: a task metric's or a mean
    latency's interval; top-1 and the paired intervals need none). The decision then finds them loaded instead of
    importing them after the last run. A decision that needs one first waits for that import (Python's import
    lock), never imports it twice; one that bootstraps unforeseen imports scipy.stats then."""
    import sys
    import threading

    loads = {"scipy.special": _special, "scipy.stats": _scipy_stats}
    wanted = [name for name in loads if (bootstrap or name == "scipy.special") and name not in _IMPORTING
              and name not in sys.modules]
    if not wanted:
        return
    _IMPORTING.update(wanted)

    def later() -> None:
        import time

        time.sleep(IMPORT_DELAY_S)        # the next container's start (made on this process's threads) goes first
        for name in wanted:
            loads[name]()

    threading.Thread(target=later, name="tiergate-import-stats", daemon=True).start()


IMPORT_DELAY_S = 1.0

_MAX_BATCH_ELEMENTS = 1_000_000   # bound bootstrap memory: resamples per batch x sample count
# BCa's jackknife costs O(n^2); beyond this many samples the bootstrap distribution of a
# mean is symmetric enough that BCa and percentile agree (measured: to 1e-4 at n = 50,000,
# where BCa took 85 s and percentile 14 s on one core).
BCA_MAX_SAMPLES = 10_000


def mcnemar_exact(correct_a, correct_b) -> McNemar:
    """Exact McNemar test: the two-sided binomial test of only_a in only_a + only_b at 1/2 (binom_half_two_sided)."""
    a, b = _paired_bools(correct_a, correct_b)
    only_a = int(np.count_nonzero(a & ~b))
    only_b = int(np.count_nonzero(~a & b))
    discordant = only_a + only_b
    p = binom_half_two_sided(only_a, discordant)
    return McNemar(n=len(a), only_a=only_a, only_b=only_b, p_value=p)


def accuracy_difference(correct_a, correct_b, *, confidence: float = 0.95, n_resamples: int = 9999,
                        seed: int = 0) -> Interval:
    """CI of accuracy(A) - accuracy(B) over the same samples: Tango's score interval on the discordant
    pairs (continuity-corrected; see paired_interval). n_resamples and seed are kept for callers; unused."""
    return paired_interval(pair_counts(correct_a, correct_b), "difference", confidence)


def paired_ratio(correct_c, correct_r, *, confidence: float = 0.95) -> Interval:
    """CI of accuracy(C) / accuracy(R) over the same samples (score interval on the discordant pairs)."""
    return paired_interval(pair_counts(correct_c, correct_r), "ratio", confidence)


def latency_ratio(latencies_a, latencies_b, *, confidence: float = 0.95, n_resamples: int = 9999,
                  seed: int = 0) -> Interval:
    """Bootstrap CI of mean(A) / mean(B); paired by call when both ran the same calls."""
    a = np.asarray(latencies_a, dtype=np.float64)
    b = np.asarray(latencies_b, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError("a latency ratio needs at least two calls on each side")
    estimate = float(a.mean() / b.mean())
    return _bootstrap((a, b), _ratio_of_means, estimate, confidence, n_resamples, seed,
                      paired=a.size == b.size)


INTERLEAVED_METHOD = "median of per-pair ratios (interleaved calls), order-statistic interval"


def interleaved_latency_ratio(latencies_a, latencies_b, *, confidence: float = 0.95) -> Interval:
    """A / B latency from interleaved call pairs (a_i and b_i timed back to back): the median of the per-pair
    ratios, with the distribution-free interval of a median (order statistics of the ratios: coverage at least
    `confidence` for any continuous distribution, whatever the host's noise looks like). A pair slowed by the
    host is one outlying ratio, not a shifted mean. Infinite bounds when there are too few pairs for the
    confidence (fewer than 6 at 95%)."""
    a = np.asarray(latencies_a, dtype=np.float64)
    b = np.asarray(latencies_b, dtype=np.float64)
    if a.size != b.size or a.size == 0:
        raise ValueError("interleaved latency needs the same number (> 0) of calls on each side")
    keep = (a > 0) & (b > 0)
    ratios = np.sort(a[keep] / b[keep])
    n = ratios.size
    if n == 0:
        return Interval(math.nan, -math.inf, math.inf, confidence, INTERLEAVED_METHOD)
    estimate = float(np.median(ratios))
    below = binom_half_cdf(np.arange(n), n)     # P(fewer than k+1 ratios below the median)
    k = int(np.searchsorted(below, (1 - confidence) / 2, side="right"))   # [r_(k), r_(n-k+1)], 1-based
    if k < 1:
        return Interval(estimate, -math.inf, math.inf, confidence, INTERLEAVED_METHOD)
    return Interval(estimate, float(ratios[k - 1]), float(ratios[n - k]), confidence, INTERLEAVED_METHOD)


def noninferior(interval: Interval, margin: float) -> bool:
    """Accuracy difference (candidate - incumbent): the whole CI lies above -margin."""
    return bool(interval.low > -margin)


def _difference_of_means(a, b, axis=-1):
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def _ratio_of_means(a, b, axis=-1):
    return np.mean(a, axis=axis) / np.mean(b, axis=axis)


def _bootstrap(data, statistic, estimate, confidence, n_resamples, seed, *, paired, vectorized=True,
               methods=None) -> Interval:
    n = max(np.shape(x)[-1] for x in data)
    width = max(int(np.prod(np.shape(x)[:-1])) for x in data)
    batch = max(1, _MAX_BATCH_ELEMENTS // (n * width))
    low = high = math.nan
    for method in methods or (("BCa", "percentile") if n <= BCA_MAX_SAMPLES else ("percentile",)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = _scipy_stats().bootstrap(data, statistic, n_resamples=n_resamples, batch=batch,
                                     vectorized=vectorized, paired=paired, confidence_level=confidence, axis=-1,
                                     method=method, rng=np.random.default_rng(seed))
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        if np.isfinite(low) and np.isfinite(high):
            return Interval(estimate, low, high, confidence, f"bootstrap-{method}")
    return Interval(estimate, low, high, confidence, "bootstrap-failed")


def _paired_bools(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=bool).ravel(), np.asarray(b, dtype=bool).ravel()
    if a.size != b.size:
        raise ValueError(f"paired samples differ in length: {a.size} vs {b.size}")
    if a.size == 0:
        raise ValueError("no paired samples")
    return a, b


# --- paired proportions: score intervals on the discordant pairs ------------------------------------------

CONTINUITY = 0.5            # half a discordant pair: keeps coverage at or above nominal at small counts
PAIRED_METHODS = {"ratio": "score-ratio-paired", "difference": "score-difference-paired"}


@dataclass(frozen=True)
class PairCounts:
    """Paired 0/1 results: samples both get right, only the first, only the second, and all samples."""

    both: float
    only_a: float
    only_b: float
    n: float


def pair_counts(correct_a, correct_b) -> PairCounts:
    a, b = _paired_bools(correct_a, correct_b)
    return PairCounts(int(np.count_nonzero(a & b)), int(np.count_nonzero(a & ~b)),
                      int(np.count_nonzero(~a & b)), int(a.size))


def paired_interval(counts: PairCounts, kind: str, confidence: float = 0.95) -> Interval:
    """The score interval of the ratio (p_a / p_b) or the difference (p_a - p_b) of two paired proportions."""
    est, low, high = paired_bounds(kind, counts.both, counts.only_a, counts.only_b, counts.n, confidence)
    return Interval(float(est), float(low), float(high), confidence, PAIRED_METHODS[kind])


def paired_bounds(kind: str, both, only_a, only_b, n, confidence: float = 0.95, iterations: int = 64):
    """(estimate, low, high), vectorised over arrays of counts: {theta : |Z(theta)| <= z} of the score statistic
    (paired_score), found by bisection on each side of the estimate."""
    both, only_a, only_b, n = (np.asarray(v, dtype=np.float64) for v in (both, only_a, only_b, n))
    z = float(norm_isf((1.0 - confidence) / 2.0))
    score = (lambda t: _ratio_score(t, both, only_a, only_b, n)) if kind == "ratio" else \
        (lambda t: _difference_score(t, both, only_a, only_b, n))
    if kind == "ratio":
        right_a, right_b = both + only_a, both + only_b
        with np.errstate(divide="ignore", invalid="ignore"):
            est = np.where(right_b > 0, right_a / np.where(right_b > 0, right_b, 1), np.where(right_a > 0, np.inf, 1.0))
        top = np.minimum(est, 1e12)
        low = _bisect(score, np.zeros_like(est), top, z, iterations, log=False)
        high = np.where(right_b > 0, _bisect(score, top, top * 0 + 1e12, -z, iterations, log=True), np.inf)
        return est, np.where(right_a > 0, low, 0.0), high
    est = (only_a - only_b) / n
    return est, _bisect(score, np.full_like(est, -1.0), est, z, iterations), \
        _bisect(score, est, np.ones_like(est), -z, iterations)


def _bisect(score, lo, hi, target, iterations, log=False):
    """The point in [lo, hi] where the decreasing score crosses target (z: the lower bound; -z: the upper)."""
    lo, hi = np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64)
    if log:
        lo, hi = np.log(np.maximum(lo, 1e-300)), np.log(hi)
    for _ in range(iterations):
        mid = (lo + hi) / 2.0
        beyond = score(np.exp(mid) if log else mid) > target
        lo, hi = np.where(beyond, mid, lo), np.where(beyond, hi, mid)
    # the lower bound is the least value inside (hi); the upper the greatest inside (lo)
    out = hi if target > 0 else lo
    return np.exp(out) if log else out


def _corrected(d, discordant):
    """The score's numerator moved half a pair towards 0, where there are discordant pairs (with none, the
    uncorrected score is already at least as wide as the exact zero-event bound)."""
    return np.sign(d) * np.maximum(np.abs(d) - np.where(discordant > 0, CONTINUITY, 0.0), 0.0)


def _z(d, var):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(var > 0, d / np.sqrt(np.where(var > 0, var, 1.0)), np.sign(d) * np.inf)


def _ratio_score(theta, both, only_a, only_b, n):
    """Tang, Tang & Chan (2003): Z(theta) for H0 p_a / p_b = theta, the restricted MLE of the only-b cell in
    closed form (the positive root of A q^2 + B q + C)."""
    right = both + only_a + only_b
    a = n * (1.0 + theta)
    b = (both + only_b) * theta ** 2 - (both + only_a + 2.0 * only_b)
    c = only_b * (1.0 - theta) * right / n
    q = (-b + np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0))) / (2.0 * a)
    var = n * (1.0 + theta) * q + right * (theta - 1.0)
    return _z(_corrected((both + only_a) - theta * (both + only_b), only_a + only_b), var)


def _difference_score(delta, both, only_a, only_b, n):
    """Tango (1998): Z(delta) for H0 p_a - p_b = delta, the restricted MLE of the only-b cell in closed form."""
    a = 2.0 * n
    b = -only_a - only_b + (2.0 * n - only_a + only_b) * delta
    c = -only_b * delta * (1.0 - delta)
    q = (-b + np.sqrt(np.maximum(b * b - 4.0 * a * c, 0.0))) / (2.0 * a)
    var = n * (2.0 * q + delta - delta ** 2)
    return _z(_corrected(only_a - only_b - n * delta, only_a + only_b), var)


def paired_samples_needed(counts: PairCounts, kind: str, op: str, threshold: float, confidence: float,
                          limit: int = 10 ** 9) -> int | None:
    """Samples for the interval to decide (pass or fail) if every kind of pair kept its observed share: the
    counts scaled to n' and the interval recomputed (its width shrinks as 1/n' without disagreements, as
    1/sqrt(n') with them). None when the estimate sits on the threshold or no n' up to `limit` decides."""
    est = paired_interval(counts, kind, confidence).estimate
    if not math.isfinite(est) or est == threshold:
        return None

    def decides(m: float) -> bool:
        f = m / counts.n
        scaled = PairCounts(counts.both * f, counts.only_a * f, counts.only_b * f, m)
        return judge(paired_interval(scaled, kind, confidence), op, threshold) != INCONCLUSIVE

    lo, hi = int(counts.n), int(counts.n)
    while not decides(hi):
        if hi >= limit:
            return None
        lo, hi = hi, min(limit, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid, hi)
    return hi


# --- task metrics: candidate / reference ratio, and what an interval decides ---------------------------

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


def metric_ratio(cand, ref, statistic, *, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0,
                 difference: bool = False, ref_statistic=None, percentile: bool = False) -> Interval:
    """Paired bootstrap CI of statistic(cand) / statistic(ref) over the same samples (with `difference`:
    statistic(cand) - statistic(ref), for a metric that can be zero or negative, where a ratio means nothing).

    `cand`, `ref`: per-sample components (c, n) with `statistic(components, axis=-1)` (vectorised); a statistic
    that can only be computed on a whole set is `whole_set_ratio`'s.
    Identical components give the degenerate interval [1, 1] ([0, 0] for a difference; nothing to resample).
    `ref_statistic`: the reference's own statistic where it differs from the candidate's (average precision,
    whose statistic holds each side's detections: the components are the image indices, the same on both).
    `percentile`: the percentile interval only (a costly statistic: BCa's jackknife calls it n more times).
    """
    combine = _minus if difference else _ratio
    cand, ref = np.asarray(cand, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    other = statistic if ref_statistic is None else ref_statistic
    estimate = combine(float(statistic(cand, axis=-1)), float(other(ref, axis=-1)))
    if ref_statistic is None and cand.shape == ref.shape and np.array_equal(cand, ref):
        if difference:
            return Interval(estimate, estimate, estimate, confidence, "degenerate")
        return _no_discordance(ref, estimate, confidence)

    def ratio(a, b, axis=-1):
        x, y = statistic(a, axis=axis), other(b, axis=axis)
        if difference:
            return x - y
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(y != 0, x / np.where(y != 0, y, 1), np.where(x == 0, 1.0, np.inf))
    return _bootstrap((cand, ref), ratio, estimate, confidence, n_resamples, seed, paired=True,
                      methods=("percentile",) if percentile else None)


OVER_BUDGET = "bootstrap-over-budget"
WHOLE_SET_RESAMPLES = 999   # a whole-set statistic's resamples: no more (the policy's fewer) unless its confidence needs
PROGRESS_EVERY_S = 5.0


def whole_set_ratio(n: int, pair, values: tuple[float, float], *, confidence: float = 0.95, n_resamples: int = 9999,
                    seed: int = 0, difference: bool = False, budget_s: float = math.inf, first_s: float = 0.0,
                    progress=None, clock=time.perf_counter) -> Interval:
    """The paired percentile bootstrap of a statistic that can only be computed on a whole set (a user metric that
    returns one number): `pair(indices) -> (candidate's value, reference's value)` on each resample, the
    resamples' indices drawn in blocks (never a thread or a copy of anything but the indices per resample here).

    Its cost is bounded by `budget_s` seconds: `n_resamples` (at most WHOLE_SET_RESAMPLES, or what the confidence
    needs where that is more: an early look's), or as many as the budget pays for at the time the calls take
    (`first_s`, the whole set's pair of calls, then as measured), but never fewer than the confidence needs
    (MIN_TAIL_RESAMPLES beyond each bound); a budget that cannot pay for those gives infinite bounds
    (inconclusive; method OVER_BUDGET). The count used is in the method. `values`: the whole set's pair (the
    estimate). `progress(done, planned, seconds)`: called every PROGRESS_EVERY_S seconds (of `clock`)."""
    combine = _minus if difference else _ratio
    estimate = combine(*values)
    alpha = 1.0 - confidence
    needed = math.ceil(2 * MIN_TAIL_RESAMPLES / alpha)
    n_resamples = min(n_resamples, max(WHOLE_SET_RESAMPLES, needed))
    planned = n_resamples if first_s <= 0 else min(n_resamples, max(0, int(budget_s / first_s)))
    if planned < needed:
        pays = f"bootstrap_resamples is {n_resamples}" if n_resamples < needed else \
            f"the budget of {budget_s:g} s pays for {planned} at {first_s:.3g} s each"
        return Interval(estimate, -math.inf, math.inf, confidence,
                        f"{OVER_BUDGET}: {needed} resamples needed at {confidence:.4%}, {pays}")
    rng = np.random.default_rng(seed)
    block = max(1, min(planned, _MAX_BATCH_ELEMENTS // max(n, 1)))
    out = np.empty(planned, dtype=np.float64)
    t0 = last = clock()
    done = 0
    while done < planned:
        for indices in rng.integers(0, n, size=(min(block, planned - done), n)):
            out[done] = combine(*pair(indices))
            done += 1
            now = clock()
            if progress is not None and now - last >= PROGRESS_EVERY_S:
                progress(done, planned, now - t0)
                last = now
            if now - t0 > 1.5 * budget_s and done < planned:     # slower than the first calls said
                planned = done
                break
    if done < needed:
        return Interval(estimate, -math.inf, math.inf, confidence,
                        f"{OVER_BUDGET}: {needed} resamples needed at {confidence:.4%}, {done} made in the budget of "
                        f"{budget_s:g} s")
    low, high = np.quantile(out[:done], [alpha / 2.0, 1.0 - alpha / 2.0])
    return Interval(estimate, float(low), float(high), confidence,
                    f"bootstrap-percentile, {done} resamples" + ("" if done == n_resamples else
                                                                 f" (the budget of {budget_s:g} s)"))


def _minus(x: float, y: float) -> float:
    return float(x) - float(y)


def _no_discordance(ref: np.ndarray, estimate: float, confidence: float) -> Interval:
    """Identical per-sample results: nothing to resample, yet n samples without one disagreement still allow a
    disagreement rate up to u = 1 - (alpha/2)^(1/n) (exact Clopper-Pearson bound for zero events). For 0/1
    hits (top-1 and the like) the accuracy ratio then lies in [(acc - u) / acc, min(1, acc + u) / acc]: 20
    identical samples do not prove a ratio of 0.99. Other statistics keep the point interval."""
    if ref.ndim == 2 and ref.shape[0] == 1 and ref.size and np.isin(ref, (0.0, 1.0)).all():
        n, acc = ref.shape[1], float(ref.mean())
        if acc > 0:
            u = 1.0 - ((1.0 - confidence) / 2.0) ** (1.0 / n)
            return Interval(estimate, max(0.0, (acc - u) / acc), min(1.0, acc + u) / acc, confidence,
                            "exact-no-disagreement")
    return Interval(estimate, estimate, estimate, confidence, "degenerate")


def _ratio(x: float, y: float) -> float:
    x, y = float(x), float(y)
    if y == 0:
        return 1.0 if x == 0 else math.inf
    return x / y


def judge(interval: Interval, op: str, threshold: float) -> str:
    """PASS when the whole interval clears the threshold, FAIL when it lies wholly on the wrong side."""
    low, high = interval.low, interval.high
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if op == ">=":
        return PASS if low >= threshold else (FAIL if high < threshold else INCONCLUSIVE)
    if op == "<=":
        return PASS if high <= threshold else (FAIL if low > threshold else INCONCLUSIVE)
    raise ValueError(f"unknown comparison {op!r}")


def samples_needed(interval: Interval, threshold: float, n: int) -> int | None:
    """Samples for the interval to clear the threshold at the observed effect (its width ~ 1/sqrt(n)).

    The half-width on the threshold's side shrinks as sqrt(n / n'); None when the estimate sits on
    the threshold (no sample size separates them) or the interval is not finite.
    """
    est, low, high = interval.estimate, interval.low, interval.high
    gap = est - threshold
    if gap == 0 or not all(math.isfinite(v) for v in (est, low, high)):
        return None
    half = (est - low) if gap > 0 else (high - est)
    return max(n, math.ceil(n * (half / abs(gap)) ** 2))


# --- early decision: looks at growing sample prefixes, alpha spent across them -------------------------

MIN_TAIL_RESAMPLES = 10     # a look's bootstrap needs this many resamples beyond each bound to place it


def alpha_spent(t: float, alpha: float, spending: str = "obrien-fleming") -> float:
    """Lan-DeMets alpha spending: the share of the two-sided error `alpha` spent by information fraction t.

    "obrien-fleming": 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) (almost nothing early, nearly all of alpha at the end);
    "pocock": alpha ln(1 + (e - 1) t) (spread evenly);
    "kim-demets": alpha t^2 (Kim and DeMets' power family at rho = 2: between the two, rho = 3 being close to
    O'Brien-Fleming and rho = 1 to Pocock). Each is 0 at t = 0 and alpha at t = 1.
    """
    if t <= 0:
        return 0.0
    if t >= 1:
        return float(alpha)
    if spending == "obrien-fleming":
        return float(2.0 * norm_sf(norm_isf(alpha / 2.0) / math.sqrt(t)))    # 2 - 2 Phi(z / sqrt t), exact tail
    if spending == "pocock":
        return float(alpha * math.log(1.0 + (math.e - 1.0) * t))
    if spending == "kim-demets":
        return float(alpha * t * t)
    raise ValueError(f"unknown alpha spending {spending!r} (known: {', '.join(SPENDING)})")


def resolvable(samples: int, alpha: float, resamples: int) -> bool:
    """Whether a look can place a bound at error `alpha`: at least 1 / alpha samples (Thresholds.min_samples)
    and MIN_TAIL_RESAMPLES bootstrap resamples beyond each bound."""
    return alpha > 0 and samples >= math.ceil(1.0 / alpha - 1e-9) and resamples * alpha / 2.0 >= MIN_TAIL_RESAMPLES


def look_plan(sizes: list[int], confidence: float, spending: str = "obrien-fleming",
              resamples: int = 9999) -> list[Look]:
    """The looks at prefix sizes `sizes` (increasing, the last = every sample) and the confidence of each.

    Look k spends alpha(t_k) - alpha(t_prev) of alpha = 1 - confidence (t = samples / all samples, t_prev that
    of the previous taken look); by the union bound the chance that any taken look's interval misses is at most
    alpha, whatever the intervals' method. A look whose sample count (or the bootstrap's resamples) cannot
    resolve its share is not taken: its share moves to the next look (this depends on the design only, never
    on the data). The last look is always taken; if its share is not resolvable, the latest earlier look is
    dropped until it is (with no earlier look, the last is the ordinary gate at `confidence`).
    """
    if not sizes or any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 1:
        raise ValueError(f"look sizes must increase from 1: {sizes}")
    n, alpha = sizes[-1], 1.0 - confidence
    taken, spent = [], 0.0
    for k, m in enumerate(sizes):
        share = alpha_spent(m / n, alpha, spending) - spent
        if k == len(sizes) - 1 or resolvable(m, share, resamples):
            taken.append(k)
            spent += share
    while len(taken) > 1:
        final = alpha - alpha_spent(sizes[taken[-2]] / n, alpha, spending)
        if resolvable(n, final, resamples):
            break
        del taken[-2]
    looks, before = [], 0.0
    for k, m in enumerate(sizes):
        if k in taken:
            upto = alpha if k == len(sizes) - 1 else alpha_spent(m / n, alpha, spending)
            looks.append(Look(k + 1, m, True, 1.0 - (upto - before)))
            before = upto
        else:
            looks.append(Look(k + 1, m, False))
    return looks
