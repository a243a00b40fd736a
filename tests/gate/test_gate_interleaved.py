"""max_latency_ratio on interleaved call pairs (issue 24): the candidate's calls alternated with the FP32
reference's in one process (extra.paired, harness_paired.py), the median per-pair ratio and its order-statistic
interval, decided like a task metric: pass, fail, or inconclusive with the pairs needed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiergate import stats
from tiergate.gate import evaluate
from tiergate.policy import load_policy

REF_SHA = "f" * 64


@pytest.fixture
def runs(classifier_data, make_outcome, to_probs):
    """The FP32 reference and a candidate with its outputs on a native and an emulated class."""
    probs = {"probs": to_probs(classifier_data[0])}

    def side(seed: int):
        return {"x86": make_outcome("x86", probs, latency_ms=1.0, seed=seed),
                "arm": make_outcome("arm", probs, latency_ms=30.0, emulated=True, seed=seed + 1)}
    return side(0), side(10)


def paired(ratio: float, n: int, *, noise: float, seed: int = 0, partner: str = REF_SHA) -> dict:
    """n pairs on a noisy host: each pair's two calls share the host's slowdown of that moment (lognormal, wide),
    the candidate's call is `ratio` times the reference's up to a small per-call jitter."""
    rng = np.random.default_rng(seed)
    host = rng.lognormal(0.0, noise, n)                       # the machine's speed at each pair
    reference = 1e6 * host * rng.lognormal(0, 0.02, n)
    candidate = 1e6 * ratio * host * rng.lognormal(0, 0.02, n)
    return {"pairs": n, "latencies_ns": candidate.astype(int).tolist(),
            "partners": [{"model": "/data/p0-0/ref.onnx", "sha256": partner,
                          "latencies_ns": reference.astype(int).tolist()}]}


def gate(runs, device_classes, tmp_path, extra, limit=1.10, labels=None):
    reference, candidate = runs
    reference["x86"].result.artifact_sha256 = REF_SHA
    candidate["x86"].result.extra = {"paired": extra}
    path = tmp_path / "p.toml"
    path.write_text(f"[defaults]\nmax_latency_ratio = {limit}\n")
    decision = evaluate(candidate, reference, device_classes, load_policy(path), labels)
    (check,) = [c for c in decision.checks if c.device_class == "x86" and c.name == "latency_ratio"]
    return decision, check


def test_a_slower_candidate_fails_on_a_host_whose_noise_swamps_the_means(runs, device_classes, tmp_path):
    # the host's noise (CoV well over 1) would make the two loops' means meaningless; the pairs hold
    decision, check = gate(runs, device_classes, tmp_path, paired(1.22, 200, noise=1.0))
    assert not check.passed and not check.inconclusive and check.interval.low > 1.10, check
    assert check.value == pytest.approx(1.22, rel=0.02) and "median of 200 pairs" in check.detail
    assert decision.verdict == "REJECT"
    metrics = decision.metrics["x86"]
    assert metrics.latency_pairs == 200 and metrics.latency_ratio_interval == check.interval
    assert metrics.latency_ratio_vs_reference == check.value


def test_the_same_model_passes_and_a_borderline_one_is_inconclusive_with_the_pairs_needed(runs, device_classes,
                                                                                        tmp_path):
    _, same = gate(runs, device_classes, tmp_path, paired(1.0, 200, noise=1.0, seed=1))
    assert same.passed and same.interval.high <= 1.10 and same.interval.low <= 1.0 <= same.interval.high
    decision, edge = gate(runs, device_classes, tmp_path, paired(1.09, 12, noise=0.5, seed=2))
    assert edge.inconclusive and not edge.passed and edge.interval.low <= 1.10 < edge.interval.high
    assert edge.samples_needed > 12 and f"about {edge.samples_needed} pairs" in edge.detail
    assert decision.verdict == "INCONCLUSIVE"


def test_pairs_with_another_artifact_or_a_failed_pairing_fall_back_to_the_means_with_a_note(runs, device_classes,
                                                                                         tmp_path):
    decision, check = gate(runs, device_classes, tmp_path, paired(1.5, 200, noise=0.1, partner="0" * 64))
    assert check.interval is None and decision.metrics["x86"].latency_pairs == 0
    assert any("not with this reference" in n for n in decision.notes)
    decision, check = gate(runs, device_classes, tmp_path, {"error": "the paired models take different batch sizes"})
    assert check.interval is None and any("interleaved latency failed (the paired" in n for n in decision.notes)


def test_noninferior_latency_against_the_incumbent_is_decided_on_its_interleaved_pairs(runs, device_classes,
                                                                                       tmp_path, make_outcome,
                                                                                       classifier_data):
    reference, candidate = runs
    inc_sha = "e" * 64
    incumbent = {"x86": make_outcome("x86", candidate["x86"].outputs, latency_ms=1.0, seed=5)}
    incumbent["x86"].result.artifact_sha256 = inc_sha
    with_ref = paired(1.0, 200, noise=1.0, seed=3)
    rng = np.random.default_rng(4)       # the incumbent's calls in the same rounds: 20% faster than the candidate
    mine = np.array(with_ref["latencies_ns"], float)
    with_ref["partners"].append({"model": "/data/p0-1/inc.onnx", "sha256": inc_sha,
                                 "latencies_ns": (mine / 1.25 * rng.lognormal(0, 0.02, 200)).astype(int).tolist()})
    reference["x86"].result.artifact_sha256 = REF_SHA
    candidate["x86"].result.extra = {"paired": with_ref}
    decision = evaluate(candidate, reference, device_classes, load_policy(None), classifier_data[1], incumbent)
    (check,) = [c for c in decision.checks if c.device_class == "x86" and c.name == "noninferior_latency"]
    assert not check.passed and "median of 200 interleaved call pairs" in check.detail
    ratio = decision.metrics["x86"].ab.latency_ratio
    assert ratio.method.startswith("median of per-pair ratios") and ratio.low > 1.10
    assert check.value == ratio.estimate and check.interval == ratio and not check.inconclusive   # shown slower


def test_emulated_classes_never_gate_pairs(runs, device_classes, tmp_path):
    reference, candidate = runs
    candidate["arm"].result.extra = {"paired": paired(3.0, 200, noise=0.1)}
    reference["arm"].result.artifact_sha256 = REF_SHA
    path = tmp_path / "p.toml"
    path.write_text("[defaults]\nmax_latency_ratio = 1.10\n")
    decision = evaluate(candidate, reference, device_classes, load_policy(path), None)
    assert not [c for c in decision.checks if c.device_class == "arm" and c.name == "latency_ratio"]
    assert decision.metrics["arm"].latency_ratio_interval is None


# -- the interval itself ---------------------------------------------------------------------------------------
def test_the_median_interval_covers_at_its_confidence_under_heavy_tailed_noise():
    covered, trials = 0, 1000
    for seed in range(trials):
        rng = np.random.default_rng(seed)
        b = np.full(40, 1e6)
        a = b * (1.2 + 0.05 * rng.standard_cauchy(40))       # no mean exists; the median does (1.2)
        interval = stats.interleaved_latency_ratio(np.abs(a), b, confidence=0.9)
        covered += interval.low <= 1.2 <= interval.high
    assert 0.9 <= covered / trials <= 0.97


def test_too_few_pairs_give_an_unbounded_interval_and_unequal_series_are_refused():
    five = stats.interleaved_latency_ratio([2, 2, 2, 2, 2], [1, 1, 1, 1, 1])
    assert five.estimate == 2 and math.isinf(five.low) and math.isinf(five.high)
    six = stats.interleaved_latency_ratio([2] * 6, [1] * 6)
    assert (six.low, six.high) == (2, 2)
    with pytest.raises(ValueError):
        stats.interleaved_latency_ratio([1, 2], [1])
