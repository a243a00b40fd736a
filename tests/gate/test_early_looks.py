"""The early decision's statistics: alpha spending, the look plan (its levels spend exactly the policy's alpha),
what an early look may stop on, and the policy keys."""

from __future__ import annotations

import math

import pytest

from tiergate import stats
from tiergate.gate import PROMOTE, REJECT, Check, settled
from tiergate.policy import EarlyStop, load_policy
from tiergate.targets import resolve


@pytest.mark.parametrize("spending", stats.SPENDING)
def test_alpha_spending_starts_at_zero_ends_at_alpha_and_grows(spending):
    values = [stats.alpha_spent(t / 20, 0.05, spending) for t in range(21)]
    assert values[0] == 0 and values[-1] == 0.05
    assert all(a < b for a, b in zip(values, values[1:]))


def test_obrien_fleming_spending_is_the_lan_demets_formula():
    from scipy.stats import norm

    assert stats.alpha_spent(0.5, 0.05) == pytest.approx(2 - 2 * norm.cdf(norm.ppf(0.975) / math.sqrt(0.5)))
    assert stats.alpha_spent(0.25, 0.05) == pytest.approx(8.85e-5, rel=1e-2)       # almost nothing early
    assert stats.alpha_spent(0.5, 0.05, "pocock") == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2))
    assert stats.alpha_spent(0.5, 0.05, "kim-demets") == pytest.approx(0.05 / 4)            # alpha t^2
    for t in (0.25, 0.5, 0.75):          # between the two: more than O'Brien-Fleming spends early, less than Pocock
        assert stats.alpha_spent(t, 0.05) < stats.alpha_spent(t, 0.05, "kim-demets") < stats.alpha_spent(t, 0.05,
                                                                                                        "pocock")


@pytest.mark.parametrize("spending", stats.SPENDING)
@pytest.mark.parametrize("n, looks, confidence, resamples", [
    (400, 4, 0.95, 9999), (2400, 4, 0.95, 9999), (50_000, 4, 0.95, 1_000_000), (400, 10, 0.95, 9999),
    (1000, 5, 0.99, 9999), (60, 4, 0.9, 999), (20, 4, 0.95, 9999)])
def test_the_looks_spend_exactly_alpha(spending, n, looks, confidence, resamples):
    sizes = [round(i * n / looks) for i in range(1, looks + 1)]
    plan = stats.look_plan(sizes, confidence, spending, resamples)
    taken = [look for look in plan if look.taken]
    assert [look.samples for look in plan] == sizes and plan[-1].taken
    assert math.isclose(sum(1 - look.confidence for look in taken), 1 - confidence, rel_tol=1e-12)
    assert all(look.confidence is None for look in plan if not look.taken)
    for look in taken[:-1]:      # every early look can resolve its share
        assert stats.resolvable(look.samples, 1 - look.confidence, resamples)


def test_unresolvable_early_looks_pass_their_share_on():
    plan = stats.look_plan([100, 200, 300, 400], 0.95)
    assert [look.taken for look in plan] == [False, True, True, True]
    assert plan[1].confidence == pytest.approx(1 - stats.alpha_spent(0.5, 0.05))
    only = stats.look_plan([5, 10, 15, 20], 0.95)           # too few samples for any early look
    assert [look.taken for look in only] == [False, False, False, True] and only[-1].confidence == pytest.approx(0.95)


def _check(name, passed, *, interval=False, inconclusive=False):
    iv = stats.Interval(0.5, 0.4, 0.6, 0.99, "bootstrap-BCa") if interval else None
    return Check("x", "t", name, 0.5, 0.9, ">=", passed, interval=iv, inconclusive=inconclusive)


def test_what_an_early_look_may_stop_on():
    run = _check("run", True)
    assert settled([run, _check("accuracy_ratio", True, interval=True)]) == PROMOTE
    assert settled([run, _check("accuracy_ratio", False, interval=True)]) == REJECT
    assert settled([run, _check("accuracy_ratio", False, interval=True, inconclusive=True)]) is None
    assert settled([_check("run", False)]) == REJECT                        # a crash stays a crash
    assert settled([run, _check("finite", False), _check("accuracy_ratio", False, inconclusive=True,
                                                          interval=True)]) == REJECT
    # estimates without an interval: their failure may change with more samples, their pass proves nothing
    assert settled([run, _check("accuracy_ratio", True, interval=True), _check("latency_p99_ms", False)]) is None
    assert settled([run, _check("cosine", True)]) is None
    assert settled([run, _check("noninferior_accuracy", True)]) == PROMOTE


def test_policy_keys_per_tier(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[defaults]\nearly_stop = true\nearly_looks = 3\n"
                    "[override.cortex-a]\nearly_spending = 'pocock'\n"
                    "[override.arm64-cpu-onnxruntime]\nearly_stop = false\n")
    policy = load_policy(path)
    x86, arm = resolve("x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime")
    assert policy.early_stop_for(x86) == EarlyStop(True, 3, "auto")        # made concrete per class and n
    assert policy.early_stop_for(arm) == EarlyStop(False, 3, "pocock")
    assert policy.for_target(arm) == load_policy(None).for_target(arm)      # no threshold changed
    default = load_policy(None)
    assert default.early_stop_for(x86) == EarlyStop(False)                  # off by default on a native class,
    assert default.early_stop_for(arm) == EarlyStop(True)                   # on for an emulated one
    off = tmp_path / "off.toml"
    off.write_text("[defaults]\nearly_stop = false\n")
    assert load_policy(off).early_stop_for(arm) == EarlyStop(False)       # the policy says so for every class
