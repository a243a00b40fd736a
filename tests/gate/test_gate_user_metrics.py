"""User metrics at the cost of one pass over the data (issue 46, item 1b): a metric that returns per-sample values
(n numbers, or each sample's numerator and denominator) is called once per side and its interval computed from
them as a built-in metric's; one that returns a number for the whole set is called per bootstrap resample on one
thread, within the policy's time budget (never fewer resamples than the confidence needs), its progress shown."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tiergate import stats, usercode
from tiergate.errors import InputError
from tiergate.gate import evaluate
from tiergate.metrics import task
from tiergate.policy import load_policy

METRICS = '''
import threading

import numpy as np

CALLS = []

def _hits(outputs, labels):
    return (outputs["out"][:, 0] > 0.5) == (labels > 0.5)

def per_sample(outputs, labels):
    CALLS.append(threading.get_ident())
    return _hits(outputs, labels).astype(float)                 # n values: the metric is their mean

def whole(outputs, labels):
    CALLS.append(threading.get_ident())
    return float(np.mean(_hits(outputs, labels)))

def iou_parts(outputs, labels):                                  # each sample's intersection and union
    CALLS.append(threading.get_ident())
    a, b = outputs["out"] > 0.5, labels[:, None] > 0.5
    return {"numerator": (a & b).sum(axis=1), "denominator": (a | b).sum(axis=1)}

def iou_whole(outputs, labels):
    a, b = outputs["out"] > 0.5, labels[:, None] > 0.5
    return float((a & b).sum() / (a | b).sum())

def wrong_keys(outputs, labels):
    return {"intersection": np.ones(len(labels)), "union": np.ones(len(labels))}

def mixed(outputs, labels):
    return 0.5 if outputs["out"][0, 0] > 10 else np.full(len(labels), 0.5)

def signed(outputs, labels):
    return outputs["out"][:, 0] - 0.5
'''
N = 200


@pytest.fixture
def case(tmp_path, make_outcome, device_classes):
    (tmp_path / "m.py").write_text(METRICS)
    rng = np.random.default_rng(46)
    labels = (rng.random(N) > 0.5).astype(np.float64)
    ref = np.where(rng.random(N) < 0.9, labels, 1 - labels)[:, None].astype(np.float32)
    cand = np.where(rng.random((N, 1)) < 0.15, 1 - ref, ref).astype(np.float32)       # worse: 15 % flipped
    dcs = {"x86": device_classes["x86"]}

    def gate(name, policy_text="", candidate=cand):
        policy_file = tmp_path / "policy.toml"
        policy_file.write_text(policy_text)
        policy = load_policy(policy_file)
        specs = task.resolve([f"{tmp_path}/m.py:{name}"], policy)
        fn = next(s.fn for s in specs if s.kind == "custom")
        fn.__globals__["CALLS"].clear()
        decision = evaluate({"x86": make_outcome("x86", {"out": candidate})}, {"x86": make_outcome("x86", {"out": ref})},
                            dcs, policy, labels, metrics=specs)
        return decision, list(fn.__globals__["CALLS"])

    return gate, cand, ref, labels


def _check(decision, name):
    return next(c for c in decision.checks if c.name == name)


def test_per_sample_values_give_the_interval_from_one_call_per_side(case):
    gate, cand, ref, labels = case
    decision, calls = gate("per_sample")
    check = _check(decision, "per_sample_ratio")
    assert len(calls) == 2                                         # the candidate's and the reference's, nothing more
    hits_c = ((cand[:, 0] > 0.5) == (labels > 0.5)).astype(float)
    hits_r = ((ref[:, 0] > 0.5) == (labels > 0.5)).astype(float)
    assert check.value == pytest.approx(hits_c.mean() / hits_r.mean())
    expected = stats.metric_ratio(hits_c[None], hits_r[None], lambda c, axis=-1: np.mean(c[0], axis=axis))
    assert (check.interval.low, check.interval.high) == pytest.approx((expected.low, expected.high))
    assert check.interval.method == expected.method == "bootstrap-BCa"      # the policy's 9999 resamples, BCa
    assert not check.passed and not check.inconclusive and check.interval.high < 0.99    # 15 % flipped: REJECT
    # the same metric returning one number is judged alike (its interval by its own bootstrap)
    whole, whole_calls = gate("whole", "[defaults]\nbootstrap_resamples = 999\n")
    assert _check(whole, "whole_ratio").value == pytest.approx(check.value)
    assert not _check(whole, "whole_ratio").passed and len(whole_calls) == 2 + 2 * 999


def test_each_samples_numerator_and_denominator_make_a_ratio_of_sums(case):
    gate, cand, ref, labels = case
    decision, calls = gate("iou_parts", "[metrics.iou_parts]\nmax_drop = 0.05\n")
    check = _check(decision, "iou_parts_difference")
    iou = lambda out: float(((out[:, 0] > .5) & (labels > .5)).sum() / ((out[:, 0] > .5) | (labels > .5)).sum())  # noqa: E731
    assert len(calls) == 2 and check.value == pytest.approx(iou(cand) - iou(ref))
    metric = decision.metrics["x86"].task["iou_parts"]
    assert (metric.candidate, metric.reference) == pytest.approx((iou(cand), iou(ref)))
    assert check.interval.low <= check.value <= check.interval.high and "per-sample values" in check.detail


def test_a_whole_set_metric_is_called_on_one_thread_of_its_own(case):
    gate, cand, ref, labels = case
    decision, calls = gate("whole", "[defaults]\nbootstrap_resamples = 500\nuser_metric_budget_s = 86400\n")
    check = _check(decision, "whole_ratio")
    assert len(calls) == 2 + 2 * 500 and len(set(calls)) == 1 and calls[0] != threading.get_ident()
    assert check.interval.method == "bootstrap-percentile, 500 resamples"
    assert "one number for the whole set" in check.detail


@pytest.mark.parametrize("name, message", [
    ("wrong_keys", r"returned a mapping with keys \['intersection', 'union'\]; per-sample parts are"),
    ("mixed", "returned per-sample values for one side and one number for the other"),
    ("signed", "the candidate's value is -0.5; a ratio threshold cannot judge"),
])
def test_per_sample_forms_are_checked(case, name, message):
    gate, cand, ref, labels = case
    candidate = np.full_like(cand, 20.0) if name == "mixed" else cand
    with pytest.raises(InputError, match=message):
        gate(name, candidate=candidate)


class _Clock:
    """A clock each pair of calls moves on by `step` seconds: the budget's arithmetic without timing anything."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now

    def pair(self, indices):
        self.now += self.step
        return float(np.mean(indices)), 100.0


def test_a_whole_set_bootstrap_makes_what_its_budget_pays_for_never_fewer_than_the_confidence_needs():
    needed, step = 400, 1 / 64                  # 10 resamples beyond each bound at 95 %; seconds a pair (exact)
    clock = _Clock(step)
    seen = []
    interval = stats.whole_set_ratio(100, clock.pair, (49.5, 100.0), budget_s=10.0, first_s=step, clock=clock,
                                     progress=lambda *a: seen.append(a))
    assert interval.method == "bootstrap-percentile, 640 resamples (the budget of 10 s)"
    assert interval.low < 0.495 < interval.high
    assert [done for done, _, _ in seen] == [320, 640] and {planned for _, planned, _ in seen} == {640}
    clock = _Clock(step)                        # slower than its first calls said: stopped past 1.5 x the budget
    slow = stats.whole_set_ratio(100, clock.pair, (49.5, 100.0), budget_s=10.0, first_s=step / 16, clock=clock)
    assert slow.method == "bootstrap-percentile, 961 resamples (the budget of 10 s)"
    clock = _Clock(step)                        # a fast one: WHOLE_SET_RESAMPLES, as many as ever
    fast = stats.whole_set_ratio(100, clock.pair, (49.5, 100.0), budget_s=1e6, first_s=step, clock=clock)
    assert fast.method == f"bootstrap-percentile, {stats.WHOLE_SET_RESAMPLES} resamples"
    clock = _Clock(step)                        # an early look's 99.44 %: what its confidence needs, more than that
    look = stats.whole_set_ratio(100, clock.pair, (49.5, 100.0), confidence=0.9944, budget_s=1e6, first_s=step,
                                 clock=clock)
    assert look.method == "bootstrap-percentile, 3572 resamples"
    clock = _Clock(step)                        # a budget that cannot pay for the confidence: inconclusive
    short = stats.whole_set_ratio(100, clock.pair, (49.5, 100.0), budget_s=2.0, first_s=step, clock=clock)
    assert (short.low, short.high) == (-np.inf, np.inf) and clock.now == 0.0
    assert short.method == (f"{stats.OVER_BUDGET}: {needed} resamples needed at 95.0000%, the budget of 2 s pays "
                            "for 128 at 0.0156 s each")
    assert stats.judge(short, ">=", 0.99) == stats.INCONCLUSIVE


def test_an_over_budget_whole_set_metric_is_inconclusive_and_says_what_to_do(case):
    gate, *_ = case
    decision, calls = gate("whole", "[defaults]\nbootstrap_resamples = 300\n")     # fewer than 95 % needs
    check = _check(decision, "whole_ratio")
    assert check.inconclusive and len(calls) == 2
    assert "400 resamples needed at 95.0000%, bootstrap_resamples is 300" in check.detail
    assert "return per-sample values" in check.detail


def test_progress_goes_to_the_running_gate():
    seen: list[str] = []
    usercode.report("before any gate")                 # nowhere: no gate runs
    with usercode.reporting(seen.append):
        usercode.report("bootstrap 1 of 2")
        with usercode.reporting(None):
            usercode.report("unheard")
    usercode.report("after")
    assert seen == ["bootstrap 1 of 2"]


def test_a_worker_runs_every_call_on_its_thread_with_the_limits_of_call():
    with usercode.Worker("metric m") as worker:
        threads = {worker.call(threading.get_ident) for _ in range(5)}
        assert len(threads) == 1 and threading.get_ident() not in threads
        with pytest.raises(InputError, match=r"metric m: called sys.exit\(3\)"):
            worker.call(lambda: __import__("sys").exit(3))
        assert worker.call(lambda: 7) == 7          # an error ends that call, not the worker
    assert usercode._redirect_depth == 0            # stdout given back when the worker ends
    release = threading.Event()
    with usercode.Worker("metric slow", timeout=0.2) as worker:
        thread = worker.thread
        with pytest.raises(InputError, match="metric slow: did not return within 0.2 s"):
            worker.call(release.wait)
    release.set()                                   # the abandoned call ends, then its thread, giving stdout back
    thread.join(10)
    assert not thread.is_alive() and usercode._redirect_depth == 0
