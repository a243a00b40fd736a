"""The gate decision over saved results: checks, verdict, reasons, failures, bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tiergate import results
from tiergate.errors import InputError
from tiergate.gate import PROMOTE, REJECT, RunOutcome, cross_tier_drift, evaluate
from tiergate.metrics import compare_outputs
from tiergate.metrics.accuracy import accuracy
from tiergate.policy import load_policy


@pytest.fixture
def policy():
    return load_policy()


@pytest.fixture
def gating(tmp_path):
    """The default policy with output agreement a gate even when labels exist (agreement = "gate")."""
    path = tmp_path / "gating.toml"
    path.write_text('[defaults]\nagreement = "gate"\n')
    return load_policy(path)


@pytest.fixture
def runs(classifier_data, make_outcome, to_probs):
    """FP32 reference on both tiers, a close candidate, emulated arm 30x slower."""
    logits, _ = classifier_data
    rng = np.random.default_rng(7)

    def side(noise: float, seed: int):
        return {
            "x86": make_outcome("x86", {"probs": to_probs(logits + rng.normal(0, noise, logits.shape))},
                                latency_ms=1.0, seed=seed),
            "arm": make_outcome("arm", {"probs": to_probs(logits + rng.normal(0, noise + 1e-6, logits.shape))},
                                latency_ms=30.0, emulated=True, seed=seed + 1),
        }
    return side(0.0, 0), side(0.0005, 10)    # a close candidate: no sample of 600 flips


def by(decision, device_class, label):
    found = [c for c in decision.checks if c.device_class == device_class and c.label == label]
    assert len(found) == 1, f"{label} on {device_class}: {found}"
    return found[0]


def test_close_float_candidate_is_promoted(runs, device_classes, policy, classifier_data):
    reference, candidate = runs
    decision = evaluate(candidate, reference, device_classes, policy, classifier_data[1])
    assert decision.verdict == PROMOTE and decision.reasons == [] and decision.exit_code == 0, decision.reasons
    labels = {c.label for c in decision.checks if c.device_class == "x86"}
    assert labels == {"run", "reference_run", "finite[probs]", "reference_finite[probs]", "accuracy_ratio[probs]"}
    assert {c.device_class for c in decision.checks} == {"x86", "arm"}


def test_quantized_candidate_gets_cosine_and_sqnr_floors(runs, device_classes, gating, classifier_data):
    reference, candidate = runs
    decision = evaluate(candidate, reference, device_classes, gating, classifier_data[1], quantized=True)
    for name in ("x86", "arm"):
        drift = compare_outputs(reference[name].outputs["probs"], candidate[name].outputs["probs"])
        cosine, sqnr = by(decision, name, "cosine[probs]"), by(decision, name, "sqnr_db[probs]")
        assert cosine.value == pytest.approx(drift.cosine) and cosine.threshold == 0.997 and cosine.op == ">="
        assert sqnr.value == pytest.approx(drift.sqnr_db) and sqnr.threshold == 20.0
        assert cosine.passed == (drift.cosine >= 0.997) and sqnr.passed == (drift.sqnr_db >= 20.0)


def test_poor_quantization_is_rejected_with_reasons(runs, device_classes, gating, classifier_data, to_probs):
    reference, candidate = runs
    coarse = np.round(reference["x86"].outputs["probs"] * 4) / 4            # 2-bit probabilities
    candidate["x86"] = RunOutcome(candidate["x86"].result, {"probs": coarse.astype(np.float32)})
    decision = evaluate(candidate, reference, device_classes, gating, classifier_data[1], quantized=True)
    assert decision.verdict == REJECT and decision.exit_code == 1
    sqnr = by(decision, "x86", "sqnr_db[probs]")
    assert not sqnr.passed and sqnr.value < 20
    assert any(r.startswith("x86 (x86-server): sqnr_db[probs] is") and "must be >= 20" in r for r in decision.reasons)
    assert all(c.passed for c in decision.checks if c.device_class == "arm")


def test_failed_run_is_a_failed_check_and_other_targets_are_kept(runs, device_classes, gating, classifier_data,
                                                                 make_outcome):
    reference, candidate = runs
    candidate["arm"] = make_outcome("arm", None, status="failed", reason="container exited 139 (segfault)")
    decision = evaluate(candidate, reference, device_classes, gating, classifier_data[1], quantized=True)
    run = by(decision, "arm", "run")
    assert decision.verdict == REJECT and not run.passed and run.value == "failed"
    assert "container exited 139 (segfault)" in run.detail
    assert [r for r in decision.reasons if r.startswith("arm")] == [run.sentence()]
    assert decision.metrics["arm"].candidate_status == "failed" and not decision.metrics["arm"].outputs
    assert decision.metrics["x86"].outputs["probs"].cosine > 0.99            # the other target's metrics kept
    assert by(decision, "x86", "cosine[probs]").passed


def test_failed_reference_rejects(runs, device_classes, policy, make_outcome):
    reference, candidate = runs
    reference["x86"] = make_outcome("x86", None, status="failed", reason="image build failed")
    decision = evaluate(candidate, reference, device_classes, policy, None)
    check = by(decision, "x86", "reference_run")
    assert decision.verdict == REJECT and not check.passed and "image build failed" in check.detail


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_output_always_fails(runs, device_classes, policy, bad):
    reference, candidate = runs
    candidate["x86"].outputs["probs"][5, 3] = bad
    policy = load_policy()
    decision = evaluate(candidate, reference, device_classes, policy, None)      # not quantized, no labels
    finite = by(decision, "x86", "finite[probs]")
    assert not finite.passed and finite.value == 1 and decision.verdict == REJECT


def test_accuracy_ratio_against_fp32(runs, device_classes, policy, classifier_data, to_probs):
    reference, candidate = runs
    logits, labels = classifier_data
    worse = logits.copy()
    worse[:60] = np.roll(worse[:60], 1, axis=1)                                # break 10% of the samples
    candidate["arm"] = RunOutcome(candidate["arm"].result, {"probs": to_probs(worse)})
    decision = evaluate(candidate, reference, device_classes, policy, labels)
    check = by(decision, "arm", "accuracy_ratio[probs]")
    cand, base = accuracy(to_probs(worse), labels), accuracy(reference["arm"].outputs["probs"], labels)
    assert check.value == pytest.approx(cand.value / base.value)
    assert not check.passed and check.threshold == 0.99
    metrics = decision.metrics["arm"]
    assert metrics.accuracy["candidate"] == cand and metrics.accuracy["reference"] == base


def test_latency_limits_apply_only_to_real_device_classes(runs, device_classes, tmp_path, make_outcome):
    reference, candidate = runs
    path = tmp_path / "p.toml"
    path.write_text("[defaults]\nmax_latency_p50_ms = 0.5\nmax_latency_p99_ms = 100\nmax_cost_per_1k = 1e-9\n")
    decision = evaluate(candidate, reference, device_classes, load_policy(path), None)
    p50 = by(decision, "x86", "latency_p50_ms")
    assert not p50.passed and p50.value == pytest.approx(decision.metrics["x86"].latency["candidate"].p50_ms)
    p99 = by(decision, "x86", "latency_p99_ms")
    assert p99.passed and p99.detail == ""                                    # 600 calls: p99 is trusted
    assert not any(c.name.startswith(("latency", "cost")) for c in decision.checks if c.device_class == "arm")
    arm = decision.metrics["arm"]
    assert arm.latency["candidate"].emulated and arm.cost_per_1k == {}
    assert arm.latency_ratio_vs_reference == pytest.approx(
        arm.latency["candidate"].mean_ms / arm.latency["reference"].mean_ms)
    assert any("arm: latency is emulated" in n for n in decision.notes)
    cost = by(decision, "x86", "cost_per_1k")
    lat = decision.metrics["x86"].latency["candidate"]
    assert cost.value == pytest.approx(0.096 / 3600 * 1000 * lat.mean_ms / 1000) and not cost.passed


@pytest.fixture
def few_calls_runs(runs, make_outcome):
    reference, candidate = runs
    for side in (reference, candidate):
        outputs = side["x86"].outputs
        side["x86"] = make_outcome("x86", outputs, latency_ms=1.0, n_calls=100)
    return reference, candidate


def test_p99_limit_needs_enough_calls(few_calls_runs, device_classes, tmp_path):
    reference, candidate = few_calls_runs
    path = tmp_path / "p.toml"
    path.write_text("[defaults]\nmax_latency_p99_ms = 100\nmax_latency_p50_ms = 100\n")
    decision = evaluate(candidate, reference, device_classes, load_policy(path), None)
    p99 = by(decision, "x86", "latency_p99_ms")
    assert not p99.passed and p99.detail == "only 100 calls; p99 needs at least 299"
    assert by(decision, "x86", "latency_p50_ms").passed


def test_unstable_latency_is_not_trusted(runs, device_classes, tmp_path, make_outcome):
    reference, candidate = runs
    candidate["x86"] = make_outcome("x86", candidate["x86"].outputs, latency_ms=1.0, cov=0.6)
    path = tmp_path / "p.toml"
    path.write_text("[defaults]\nmax_latency_p50_ms = 100\n")
    decision = evaluate(candidate, reference, device_classes, load_policy(path), None)
    check = by(decision, "x86", "latency_p50_ms")
    assert check.value < 100 and not check.passed and check.detail.startswith("unstable run: CoV")
    assert decision.metrics["x86"].latency["candidate"].unstable


def test_ab_against_incumbent_non_inferiority(runs, device_classes, policy, classifier_data, to_probs, make_outcome):
    reference, candidate = runs
    logits, labels = classifier_data
    better = logits.copy()
    better[np.arange(len(labels)), labels] += 2.0                 # the incumbent is clearly more accurate
    incumbent = {"x86": make_outcome("x86", {"probs": to_probs(better)}, latency_ms=1.0, seed=3)}
    decision = evaluate(candidate, reference, device_classes, policy, labels, incumbent)
    check = by(decision, "x86", "noninferior_accuracy[probs]")
    ab = decision.metrics["x86"].ab
    ok_c = candidate["x86"].outputs["probs"].argmax(1) == labels
    ok_i = better.argmax(1) == labels
    assert ab.accuracy_difference.estimate == pytest.approx(ok_c.mean() - ok_i.mean())
    assert (ab.mcnemar.only_a, ab.mcnemar.only_b) == (int(np.sum(ok_c & ~ok_i)), int(np.sum(~ok_c & ok_i)))
    # its interval straddles -margin: neither shown non-inferior nor shown worse (issue 42: it failed before)
    assert ab.accuracy_difference.low < -0.01 < ab.accuracy_difference.high
    assert not check.passed and check.inconclusive and check.samples_needed and check.threshold == -0.01
    assert check.value == ab.accuracy_difference.estimate and check.interval == ab.accuracy_difference
    assert decision.verdict == "INCONCLUSIVE"
    assert by(decision, "x86", "noninferior_latency").passed               # same latency distribution
    assert "arm" not in {c.device_class for c in decision.checks if c.name.startswith("noninferior")}

    same = {"x86": make_outcome("x86", {"probs": candidate["x86"].outputs["probs"].copy()}, latency_ms=1.0)}
    assert by(evaluate(candidate, reference, device_classes, policy, labels, same), "x86",
              "noninferior_accuracy[probs]").passed


def test_non_inferiority_is_pass_fail_or_inconclusive_on_its_interval(runs, device_classes, policy, classifier_data,
                                                                       to_probs, make_outcome):
    """Issue 42: noninferior_accuracy and noninferior_latency passed or failed on one bound; an interval straddling
    the margin is INCONCLUSIVE (exit 3), as the README promises. Shown worse: REJECT; shown non-inferior: PROMOTE."""
    reference, candidate = runs
    logits, labels = classifier_data
    perfect = np.full_like(logits, -5.0)
    perfect[np.arange(len(labels)), labels] = 5.0                 # the incumbent is right on every sample
    worse = evaluate(candidate, reference, device_classes, policy, labels,
                     {"x86": make_outcome("x86", {"probs": to_probs(perfect)}, latency_ms=1.0, seed=3)})
    check = by(worse, "x86", "noninferior_accuracy[probs]")
    assert check.interval.high < -0.01 and not check.passed and not check.inconclusive and worse.verdict == REJECT
    # latency: the candidate 1.0 ms against an incumbent of 0.95 ms, few noisy calls: the ratio's interval straddles
    # 1 + max_latency_regression (1.10 by default); against one of 0.5 ms it is shown slower
    same = {"probs": candidate["x86"].outputs["probs"].copy()}
    for incumbent_ms, expected in ((0.95, "inconclusive"), (0.5, "fail"), (1.5, "pass")):
        noisy = dict(candidate)
        noisy["x86"] = make_outcome("x86", candidate["x86"].outputs, latency_ms=1.0, cov=0.3, n_calls=12, seed=5)
        decision = evaluate(noisy, reference, device_classes, policy, labels,
                            {"x86": make_outcome("x86", same, latency_ms=incumbent_ms, cov=0.3, n_calls=12, seed=6)})
        latency = by(decision, "x86", "noninferior_latency")
        got = "pass" if latency.passed else "inconclusive" if latency.inconclusive else "fail"
        assert got == expected and latency.interval is not None, (incumbent_ms, latency)


def test_ab_without_labels_uses_fp32_agreement(runs, device_classes, policy, make_outcome):
    reference, candidate = runs
    incumbent = {"x86": make_outcome("x86", {"probs": reference["x86"].outputs["probs"].copy()}, latency_ms=2.0)}
    decision = evaluate(candidate, reference, device_classes, policy, None, incumbent)
    ab = decision.metrics["x86"].ab
    assert ab.correctness == "agreement with FP32 top-1"
    latency = by(decision, "x86", "noninferior_latency")       # candidate 1 ms vs incumbent 2 ms
    assert latency.passed and ab.latency_ratio.high < 0.6


def test_failed_incumbent_is_a_note_not_a_failure(runs, device_classes, policy, make_outcome):
    reference, candidate = runs
    incumbent = {"x86": make_outcome("x86", None, status="failed", reason="gone")}
    decision = evaluate(candidate, reference, device_classes, policy, None, incumbent)
    assert decision.verdict == PROMOTE
    assert any("incumbent run failed (gone)" in n for n in decision.notes)


def test_missing_or_misshapen_output_fails(runs, device_classes, policy):
    reference, candidate = runs
    candidate["x86"] = RunOutcome(candidate["x86"].result, {"scores": candidate["x86"].outputs["probs"]})
    candidate["arm"] = RunOutcome(candidate["arm"].result, {"probs": candidate["arm"].outputs["probs"][:, :5]})
    decision = evaluate(candidate, reference, device_classes, policy, None)
    assert not by(decision, "x86", "output_present[probs]").passed
    shape = by(decision, "arm", "output_shape[probs]")
    assert not shape.passed and shape.value == "(600, 5)" and shape.threshold == "(600, 10)"


@pytest.mark.parametrize("mutate, message", [
    (lambda c, r, lab: c.update(riscv=c["x86"]), "candidate result: unknown device class 'riscv'; known: arm, x86"),
    (lambda c, r, lab: r.pop("arm"), "no FP32 reference result for device class 'arm'"),
    (lambda c, r, lab: lab.__setitem__(0, lab[0][:-5]), "labels: 595 labels but output 'probs' holds 600 samples"),
    (lambda c, r, lab: lab.__setitem__(0, lab[0] + 10), "but output 'probs' has only 10 scores per sample"),
    (lambda c, r, lab: lab.__setitem__(0, np.array(lab[0][0])), "labels must be numbers, texts or boxes with the sample axis first"),
])
def test_bad_input_is_one_clear_error(runs, device_classes, policy, classifier_data, mutate, message):
    reference, candidate = runs
    labels = [classifier_data[1].copy()]
    mutate(candidate, reference, labels)
    with pytest.raises(InputError) as err:
        evaluate(candidate, reference, device_classes, policy, labels[0])
    assert message in err.value.one_line()


def test_cross_tier_drift_matrix(runs):
    reference, _ = runs
    matrix = cross_tier_drift(reference)
    assert matrix.device_classes == ["x86", "arm"]
    table = matrix.matrix("max_abs_error", "probs")
    expected = compare_outputs(reference["x86"].outputs["probs"], reference["arm"].outputs["probs"])
    assert table[0, 1] == pytest.approx(expected.max_abs_error) and table[0, 1] > 0
    assert table[1, 0] == pytest.approx(table[0, 1]) and math.isnan(table[0, 0])
    assert matrix.matrix("relative_l2", "probs")[0, 1] == pytest.approx(expected.relative_l2)


def test_cross_tier_drift_skips_failed_runs(runs, make_outcome):
    reference, _ = runs
    reference["gpu"] = make_outcome("gpu", None, status="failed", reason="no GPU")
    assert cross_tier_drift(reference).device_classes == ["x86", "arm"]


def test_decision_json_is_strict_json(runs, device_classes, policy, classifier_data, make_outcome):
    reference, candidate = runs
    candidate["arm"] = make_outcome("arm", None, status="failed", reason="boom")
    decision = evaluate(candidate, reference, device_classes, policy, classifier_data[1], quantized=True)
    data = json.loads(decision.dumps())
    assert data["verdict"] == "REJECT" and data["quantized"] is True
    assert len(data["checks"]) == len(decision.checks) and data["reasons"] == decision.reasons
    assert data["metrics"]["x86"]["outputs"]["probs"]["sqnr_db"] == pytest.approx(
        decision.metrics["x86"].outputs["probs"].sqnr_db)
    assert data["metrics"]["x86"]["cost_per_1k"]["candidate"] > 0
    assert data["metrics"]["arm"]["candidate_status"] == "failed"
    assert data["drift"]["reference"]["device_classes"] == ["x86", "arm"]
    assert data["drift"]["candidate"]["device_classes"] == ["x86"]


def test_saved_result_folders_round_trip(runs, tmp_path, device_classes, policy, classifier_data):
    reference, candidate = runs
    loaded = {}
    for side, outcomes in (("ref", reference), ("cand", candidate)):
        loaded[side] = {}
        for name, outcome in outcomes.items():
            folder = results.save(outcome.result, tmp_path / side / name, outcome.outputs)
            loaded[side][name] = RunOutcome.load(folder)
    direct = evaluate(candidate, reference, device_classes, policy, classifier_data[1], quantized=True)
    from_disk = evaluate(loaded["cand"], loaded["ref"], device_classes, policy, classifier_data[1], quantized=True)
    assert from_disk.to_json() == direct.to_json()


def test_gate_core_imports_neither_docker_nor_prefect():
    import subprocess
    import sys

    code = ("import sys, tiergate.gate, tiergate.evaldata, tiergate.reports.junit, tiergate.reports.markdown; "
            "print(sorted(m for m in ('docker', 'prefect') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
