"""Each metric against an independent computation on fresh random data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnxruntime.quantization.qdq_loss_debug import compute_signal_to_quantization_noice_ratio
from scipy import stats
from scipy.spatial import distance

from tiergate.metrics import compare_outputs, cost_per_1k, latency_stats, sqnr_db
from tiergate.metrics.accuracy import accuracy
from tiergate.metrics.drift import is_probability, kl_divergence
from tiergate.metrics.latency import p99_min_samples


@pytest.fixture(params=[0, 1, 2])
def rng(request):
    return np.random.default_rng(1000 + request.param)


def noisy_pair(rng, shape=(50, 4, 6), noise=0.05):
    ref = rng.normal(size=shape).astype(np.float32)
    return ref, (ref + rng.normal(scale=noise, size=shape)).astype(np.float32)


def test_sqnr_matches_onnxruntime_qdq_loss_debug(rng):
    ref, out = noisy_pair(rng, noise=rng.uniform(0.001, 0.5))
    # onnxruntime computes in the arrays' dtype: exact on float64, float32 rounding on float32
    ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
    assert sqnr_db(ref64, out64) == pytest.approx(compute_signal_to_quantization_noice_ratio(ref64, out64), rel=1e-12)
    assert compare_outputs(ref, out).sqnr_db == pytest.approx(
        compute_signal_to_quantization_noice_ratio(ref, out), rel=1e-6)


def test_sqnr_of_identical_outputs_is_finite_like_onnxruntime(rng):
    ref, _ = noisy_pair(rng)
    assert math.isfinite(sqnr_db(ref, ref))
    assert sqnr_db(ref, ref) == pytest.approx(compute_signal_to_quantization_noice_ratio(ref, ref))


def test_error_metrics_match_float64_and_scipy(rng):
    ref, out = noisy_pair(rng)
    drift = compare_outputs(ref, out)
    r64, o64 = ref.astype(np.float64), out.astype(np.float64)
    errors = [abs(a - b) for a, b in zip(r64.ravel().tolist(), o64.ravel().tolist())]
    assert drift.max_abs_error == pytest.approx(max(errors), rel=1e-12)
    assert drift.p99_abs_error == pytest.approx(stats.scoreatpercentile(errors, 99), rel=1e-12)
    assert drift.relative_l2 == pytest.approx(
        math.sqrt(sum(e * e for e in errors)) / math.sqrt(sum(v * v for v in r64.ravel().tolist())), rel=1e-9)
    cosines = [1 - distance.cosine(a.ravel(), b.ravel()) for a, b in zip(r64, o64)]
    assert drift.cosine == pytest.approx(np.mean(cosines), rel=1e-12)
    assert drift.cosine_min == pytest.approx(min(cosines), rel=1e-12)
    assert drift.n_samples == 50 and drift.non_finite == 0


def test_top1_agreement_counts_matching_argmax(rng):
    ref = rng.normal(size=(300, 1, 10))
    out = ref + rng.normal(scale=0.4, size=ref.shape)
    expected = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(ref, out)) / 300
    assert compare_outputs(ref, out).top1_agreement == pytest.approx(expected)
    assert 0.5 < expected < 1.0          # the noise really flips some samples
    assert compare_outputs(ref[:, :, :1], out[:, :, :1]).top1_agreement is None


def test_kl_divergence_matches_scipy_entropy_for_probability_outputs(rng):
    ref = rng.dirichlet(np.ones(8), size=200)
    out = rng.dirichlet(np.ones(8), size=200)
    expected = np.mean([stats.entropy(p, q) for p, q in zip(ref, out)])
    assert is_probability(ref)
    assert compare_outputs(ref, out).kl_divergence == pytest.approx(expected, rel=1e-9)


def test_kl_is_finite_when_quantization_zeroes_a_class(rng):
    ref = rng.dirichlet(np.ones(4), size=20)
    out = ref.copy()
    out[:, 0], out[:, 1] = 0.0, out[:, 1] + ref[:, 0]
    value = kl_divergence(ref, out)
    assert math.isfinite(value) and value > 1.0


def test_kl_only_for_probability_outputs(rng):
    logits = rng.normal(size=(20, 5))
    assert not is_probability(logits)
    assert compare_outputs(logits, logits + 0.1).kl_divergence is None


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_outputs_are_counted(rng, bad):
    ref, out = noisy_pair(rng)
    out[3, 1, 2] = bad
    out[7, 0, 0] = bad
    drift = compare_outputs(ref, out)
    assert drift.non_finite == 2
    assert not drift.cosine >= 0.997        # NaN or worse: can never pass a floor


def test_shape_mismatch_is_refused(rng):
    with pytest.raises(ValueError, match="shapes differ"):
        compare_outputs(np.zeros((3, 4)), np.zeros((3, 5)))


def test_accuracy_and_wilson_interval(rng):
    n = 400
    labels = rng.integers(0, 10, n)
    scores = rng.normal(size=(n, 10))
    scores[np.arange(n), labels] += rng.normal(1.5, 1.0, n)          # mostly right, not always
    est = accuracy(scores, labels, confidence=0.9)
    k = sum(int(np.argmax(s) == y) for s, y in zip(scores, labels))
    p, z = k / n, stats.norm.ppf(0.95)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert est.value == pytest.approx(p) and 0.3 < p < 0.95
    assert (est.low, est.high) == pytest.approx((centre - half, centre + half), rel=1e-9)
    assert est.n == n and est.confidence == 0.9


def test_latency_stats_match_scipy(rng):
    latencies = rng.lognormal(mean=np.log(2e6), sigma=0.1, size=350).astype(np.int64)
    lat = latency_stats(latencies, batch_size=4, max_cov=0.2, min_samples_p99=299)
    ms = latencies.astype(np.float64) / 1e6
    assert lat.p50_ms == pytest.approx(np.median(ms))
    assert lat.p90_ms == pytest.approx(stats.scoreatpercentile(ms, 90))
    assert lat.p99_ms == pytest.approx(stats.scoreatpercentile(ms, 99))
    assert lat.mean_ms == pytest.approx(stats.tmean(ms))
    assert lat.cov == pytest.approx(stats.variation(ms, ddof=1))
    assert lat.throughput_per_s == pytest.approx(4 * len(ms) / ms.sum() * 1000)
    assert lat.p99_reliable and not lat.unstable and lat.n_calls == 350


def test_latency_flags_unstable_runs_and_unreliable_p99(rng):
    noisy = np.concatenate([rng.normal(1e6, 1e4, 90), rng.normal(5e6, 1e4, 10)])
    lat = latency_stats(noisy, max_cov=0.25, min_samples_p99=299)
    assert lat.cov > 0.25 and lat.unstable
    assert not lat.p99_reliable
    assert latency_stats([], max_cov=0.25) is None


def test_p99_sample_rule_is_the_distribution_free_bound():
    n = p99_min_samples(0.95)
    assert 1 - 0.99 ** n >= 0.95 > 1 - 0.99 ** (n - 1)
    assert n == 299                                    # the policy's default


def test_cost_per_1k_from_total_run_time(rng):
    latencies_ns = rng.normal(3e6, 2e5, 500)
    batch, per_hour = 2, 0.096
    lat = latency_stats(latencies_ns, batch_size=batch)
    hours = latencies_ns.sum() / 1e9 / 3600
    expected = per_hour * hours / (batch * len(latencies_ns)) * 1000
    assert cost_per_1k(per_hour, lat.throughput_per_s) == pytest.approx(expected, rel=1e-9)
    assert math.isnan(cost_per_1k(per_hour, 0.0))
