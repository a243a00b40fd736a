"""tiergate bisect: delta debugging over optimizer passes and recipe options, each step a gate through the one
gate path (here on the in-memory fakes: FakeBackend.broken_by is a pass that breaks the candidate unless the
candidate's class switches it off). The real case (onnxruntime's QDQ transformer on the AVX2 tier) is in
tests/realmodels/test_realmodels_bisect.py."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

import gatekit
import modelkit
from fakes import FakeBackend, FakeBuilder
from tiergate import bisect as core
from tiergate import orchestrator
from tiergate.cli.main import main
from tiergate.orchestrator.bisect import bisect_passes, bisect_recipe
from tiergate.policy import load_policy
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"
PASSES = ["Level1_RuleBasedTransformer", "ConstantFolding", "QDQSelectorActionTransformer", "ReshapeFusion",
          "NchwcTransformer", "ConvActivationFusion"]


@pytest.mark.parametrize("n", [1, 2, 7, 16, 50])
def test_ddmin_finds_one_culprit_in_logarithmic_steps(n):
    items = [f"p{i}" for i in range(n)]
    culprit = items[n // 3]
    asked = []

    def holds(subset):
        asked.append(subset)
        return culprit in subset

    assert core.ddmin(items, holds) == (culprit,)
    assert len(asked) == len(set(asked))                      # each subset asked once
    assert len(asked) <= 2 * math.ceil(math.log2(max(n, 2))) + 2


def test_ddmin_finds_two_culprits_that_only_together_hold():
    items = [f"p{i}" for i in range(12)]

    def holds(subset):
        return "p2" in subset and "p9" in subset

    assert core.ddmin(items, holds) == ("p2", "p9")


def test_ddmin_result_is_one_minimal_when_either_of_two_is_enough():
    items = [f"p{i}" for i in range(10)]
    found = core.ddmin(items, lambda s: "p1" in s or "p7" in s)
    assert len(found) == 1 and found[0] in ("p1", "p7")


@pytest.fixture
def case(tmp_path, tiergate_home):
    """A labelled 4-in 3-class classifier, 400 samples, and a candidate that differs from it by 1e-4."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3))
    x = rng.normal(size=(400, 4)).astype(np.float32)
    data = tmp_path / "eval.npz"
    np.savez(data, x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + 1e-4, softmax=True), tmp_path / "cand.onnx")
    return {"candidate": cand, "reference": ref, "data": data, "tmp": tmp_path}


def _request(case, **fields):
    return gatekit.request(case["candidate"], case["reference"], case["data"], resolve([X86]), load_policy(None),
                           early_stop=False, **fields)


def _seams(backend):
    return orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)


def test_bisect_names_the_pass_that_breaks_the_candidate_and_reuses_the_reference(case):
    backend = FakeBackend(broken_by={(X86, "QDQSelectorActionTransformer"): 0.5})
    report = bisect_passes(_request(case), X86, passes=PASSES, seams=_seams(backend))
    assert report.status == core.FOUND and report.exit_code == 0
    assert report.culprits == ["QDQSelectorActionTransformer"]
    assert report.steps[0].applied == [] and report.steps[0].outcome == core.FAIL
    # every pass off, then the last two passes alone (each fails here), then delta debugging
    assert report.steps[1].applied == PASSES and report.steps[1].outcome == core.PASS
    assert [s.applied for s in report.steps[2:4]] == [["ConvActivationFusion"], ["NchwcTransformer"]]
    assert report.check["before"] != report.check["after"]
    assert report.alternatives == []                    # the search from the other end finds the same pass
    assert len(report.steps) <= 2 + 2 * (2 * 3 + 1)
    assert [r for r, _ in backend.runs].count("reference") == 1     # the reference's run came from the cache after
    text = "\n".join(report.lines())
    assert "QDQSelectorActionTransformer" in text and report.check["label"] in text


def test_a_gate_with_the_pass_off_says_so_and_keeps_the_reference_run(case):
    backend = FakeBackend(broken_by={(X86, "ConstantFolding"): 0.5})
    seams = _seams(backend)
    broken = orchestrator.gate(_request(case), seams, orchestrator.RunOptions())
    fixed = orchestrator.gate(dataclasses.replace(_request(case), disabled_passes=("ConstantFolding",)), seams,
                              orchestrator.RunOptions())
    assert broken.decision.verdict == "REJECT" and fixed.decision.verdict == "PROMOTE"
    assert any("ConstantFolding" in note for note in fixed.decision.notes)
    assert not any("optimizer passes off" in note for note in broken.decision.notes)
    assert broken.run_dirs[("candidate", X86)] != fixed.run_dirs[("candidate", X86)]
    assert broken.run_dirs[("reference", X86)] == fixed.run_dirs[("reference", X86)]
    # in one start, each job runs on its own class: the passes off are the candidate's alone
    fresh = orchestrator.gate(dataclasses.replace(_request(case), disabled_passes=("NchwcTransformer",)),
                              seams, orchestrator.RunOptions(root=case["tmp"] / "other-runs"))
    assert fresh.decision.verdict == "REJECT"             # ConstantFolding still breaks it
    from tiergate.execution.base import harness_command
    jobs = [j for j in backend.jobs if j.device_class.name == X86]
    assert [j.device_class.disabled_passes for j in jobs if j.role == "reference"] == [(), ()]
    assert ("ConstantFolding",) in {j.device_class.disabled_passes for j in jobs if j.role == "candidate"}
    args = harness_command([j for j in jobs if j.role == "reference"][:1] + [j for j in jobs if j.role == "candidate"
                            and j.device_class.disabled_passes][:1], ["r.onnx", "c.onnx"], "d.npz", ["o1", "o2"])
    assert args[args.index("--disabled") + 1] == "1=ConstantFolding" and args.count("--disabled") == 1


def test_a_culprit_among_the_last_passes_is_found_alone_in_four_gates(case):
    """The pass that picks the kernels runs late: after every pass off, the last two passes are tried alone, so the
    culprit among them costs four gates in all (switching it back on fails: a 1-minimal set), not delta debugging's
    seven."""
    backend = FakeBackend(broken_by={(X86, "NchwcTransformer"): 0.5})
    report = bisect_passes(_request(case), X86, passes=PASSES, seams=_seams(backend), alternatives=False)
    assert report.status == core.FOUND and report.culprits == ["NchwcTransformer"]
    assert [s.applied for s in report.steps] == [[], PASSES, ["ConvActivationFusion"], ["NchwcTransformer"]]
    assert [s.outcome for s in report.steps] == [core.FAIL, core.PASS, core.FAIL, core.PASS]


def test_two_passes_that_both_break_it_are_one_set(case):
    backend = FakeBackend(broken_by={(X86, "ConstantFolding"): 0.5, (X86, "NchwcTransformer"): 0.5})
    report = bisect_passes(_request(case), X86, passes=PASSES, seams=_seams(backend))
    assert sorted(report.culprits) == ["ConstantFolding", "NchwcTransformer"] and report.alternatives == []


def test_the_search_from_the_other_end_names_a_second_sufficient_pass(case, monkeypatch):
    """A failure that needs two passes in a chain: switching either off is enough (as ConstantFolding and the QDQ
    transformer on the real AVX2 case). The search from the last pass names the later one, the one from the first
    pass the earlier."""
    import fakes

    backend = FakeBackend()
    real_run = FakeBackend.run

    def run(self, job):
        off = set(job.device_class.disabled_passes)
        self.broken_by = {} if off & {"ConstantFolding", "QDQSelectorActionTransformer"} else {
            (X86, "chain"): 0.5}
        return real_run(self, job)

    monkeypatch.setattr(fakes.FakeBackend, "run", run)
    report = bisect_passes(_request(case), X86, passes=PASSES, seams=_seams(backend))
    assert report.culprits == ["QDQSelectorActionTransformer"] and report.alternatives == [["ConstantFolding"]]
    assert "also enough alone: ConstantFolding" in "\n".join(report.lines())
    first = bisect_passes(_request(case), X86, passes=PASSES, seams=_seams(backend), alternatives=False)
    assert first.culprits == ["QDQSelectorActionTransformer"] and first.alternatives == []


def test_a_state_back_at_the_reference_but_inconclusive_is_fixed_and_the_culprit_is_named(case):
    """The issue's case in small: every pass on REJECTs beyond doubt; every pass off gives the reference's accuracy,
    which on 150 samples is INCONCLUSIVE against 0.99 (its interval straddles it). The failing check no longer
    fails: the passes are the cause, and the culprit is named with every state's interval."""
    few = case["tmp"] / "few.npz"
    with np.load(case["data"]) as npz:
        np.savez(few, x=npz["x"][:150], labels=npz["labels"][:150])
    backend = FakeBackend(broken_by={(X86, "QDQSelectorActionTransformer"): 0.5})
    report = bisect_passes(_request({**case, "data": few}), X86, passes=PASSES, seams=_seams(backend),
                           alternatives=False)
    assert report.status == core.FOUND and report.culprits == ["QDQSelectorActionTransformer"], report.lines()
    first, every = report.steps[:2]
    assert every.applied == PASSES
    assert first.outcome == core.FAIL and not first.fixed and first.high < 0.99
    assert every.outcome == core.INCONCLUSIVE and every.fixed and every.low < 0.99 <= every.value <= every.high
    assert report.check["after_interval"] == [every.low, every.high]
    text = "\n".join(report.lines())
    assert f"[{core._fig(every.low)}, {core._fig(every.high)}]" in text and "counted as fixed" in text
    assert "inconclusive" in report.note and "counted as fixed" in report.note


@pytest.mark.parametrize("outcome, value, op, expected", [
    (core.PASS, 0.5, ">=", True), (core.FAIL, 1.0, ">=", False), (core.INCONCLUSIVE, 1.0, ">=", True),
    (core.INCONCLUSIVE, 0.985, ">=", False), (core.INCONCLUSIVE, 0.01, "<=", True), (core.INCONCLUSIVE, 0.03, "<=", False),
    (core.INCONCLUSIVE, "n/a", ">=", False)])
def test_a_state_no_longer_fails_when_it_passes_or_its_estimate_is_back_on_the_passing_side(outcome, value, op,
                                                                                             expected):
    threshold = 0.99 if op == ">=" else 0.02
    assert core.no_longer_fails(outcome, value, op, threshold) is expected


def test_when_no_pass_is_to_blame_bisect_says_so(case):
    backend = FakeBackend(broken_by={(X86, "SomethingElse"): 0.5})
    report = bisect_passes(_request(case), X86, passes=PASSES, seams=_seams(backend))
    assert report.status == core.NOT_FOUND and report.exit_code == 1 and report.culprits == []
    assert "not the cause" in report.note and len(report.steps) == 2


def test_nothing_to_bisect_when_the_check_passes(case):
    report = bisect_passes(_request(case), X86, passes=PASSES, seams=_seams(FakeBackend()))
    assert report.status == core.NOTHING and report.exit_code == 0 and len(report.steps) == 1


def test_cli_bisect_json_and_errors(case, monkeypatch, capsys):
    backend = FakeBackend(broken_by={(X86, "NchwcTransformer"): 0.5})
    gatekit.fake_cli_seams(monkeypatch, FakeBuilder(), backend)
    base = ["bisect", "-c", str(case["candidate"]), "-r", str(case["reference"]), "-d", str(case["data"]),
            "--target", X86, "--passes", ",".join(PASSES)]
    assert main(base + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["culprits"] == ["NchwcTransformer"] and doc["status"] == "found"
    assert {"culprits", "steps", "check"} <= set(doc) and doc["check"]["label"]
    assert main(base + ["--check", "no_such_check"]) == 2
    err = capsys.readouterr().err
    assert "--check no_such_check: no such check" in err and "Traceback" not in err
    assert main(base + ["--good", str(case["data"])]) == 2
    assert "--good and --bad go with --recipe" in capsys.readouterr().err


RECIPE = '''
import numpy as np
import modelkit

def make(options, output):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3)) * options.get("scale", 1.0)
    if options.get("per_channel"):
        w = w + 1e-6
    w = w + options.get("noise", 0.0) * np.random.default_rng(1).normal(size=w.shape)
    modelkit.write(modelkit.linear(w, softmax=True), output)
'''


def test_recipe_bisect_names_the_option_that_breaks_it(case):
    recipe = case["tmp"] / "recipe.py"
    recipe.write_text(RECIPE)
    good, bad = case["tmp"] / "good.toml", case["tmp"] / "bad.toml"
    good.write_text('scale = 1.0\nnoise = 0.0\nper_channel = false\ncalibration = "minmax"\n')
    bad.write_text('scale = 1.0000001\nnoise = 3.0\nper_channel = true\ncalibration = "entropy"\n')
    report = bisect_recipe(_request(case), X86, f"{recipe}:make", good, bad, seams=_seams(FakeBackend()))
    assert report.status == core.FOUND and report.culprits == ["noise"], report.lines()
    assert report.searched == ["calibration", "noise", "per_channel", "scale"]
    assert report.steps[0].outcome == core.FAIL and report.steps[1].outcome == core.PASS


def test_the_passes_searched_are_those_each_runtime_reports_changing_the_graph():
    from tiergate.runtime_graph import modified_by

    ort = {"runtime": "onnxruntime", "default_level": "all",
           "transformers": {"basic": [["ConstantFolding", 2, 1]],
                            "all": [["ConstantFolding", 2, 1], ["MatMulAddFusion", 3, 0], ["NchwcTransformer", 2, 1]]}}
    assert modified_by(ort) == ["ConstantFolding", "NchwcTransformer"]
    assert modified_by({"runtime": "tflite", "placement": {"xnnpack": 3, "default": 1}}) == ["XNNPACK"]
    assert modified_by({"runtime": "tflite", "placement": {"default": 4}}) == []
    passes = [{"name": "Normalize", "fingerprint": "a"}, {"name": "FuseOps", "fingerprint": "b"},
              {"name": "DeadCodeElimination", "fingerprint": "b"}, {"name": "FuseOps", "fingerprint": "c"},
              {"name": "LegalizeOps", "fingerprint": "d"}]
    assert modified_by({"runtime": "tvm", "passes": passes}) == ["Normalize", "FuseOps", "LegalizeOps"]
