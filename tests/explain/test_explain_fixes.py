"""explain --fix's pure parts, in seconds: the search for the shortest passing prefix (a fake gate), the ranked
layers and their nodes in the candidate's own graph, the candidate's own ranges re-made by onnxruntime's quantizer,
the verdict per tier with its interval, the table's order and its JSON, Markdown and HTML. The real gates are in
test_explain_fix_tiers.py."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

import modelkit
import models
from tiergate.decision import Check
from tiergate.explain import Explanation, Layer, TierExplain, markdown_table
from tiergate.explain import fixes as fx
from tiergate.figures import Interval

X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"


# --- the search ---------------------------------------------------------------------------------------------


def _fake_gate(ranked: list[str], needed: set[str], calls: list[int]):
    """A gate that passes once every layer of `needed` is in the prefix (and counts its calls)."""
    def passes(k: int) -> bool:
        calls.append(k)
        return needed <= set(ranked[:k])
    return passes


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 31, 64, 469])
def test_the_search_finds_the_minimal_prefix_within_2_log2_n_plus_1_gates(n):
    ranked = [f"layer{i}" for i in range(n)]
    targets = range(1, n + 1) if n <= 64 else [1, 2, 3, 100, 234, 235, 468, 469]
    for t in targets:
        for needed in ({ranked[t - 1]}, {ranked[0], ranked[t - 1]}, {ranked[t // 2], ranked[t - 1]}):
            calls: list[int] = []
            search = fx.shortest_passing_prefix(n, _fake_gate(ranked, needed, calls))
            assert search.found == t, (n, t, needed, calls)
            assert len(calls) == len(set(calls)) == search.gates            # no length gated twice
            assert search.gates <= 2 * math.ceil(math.log2(n)) + 1 if n > 1 else search.gates == 1
            assert search.gates <= fx.max_gates(n)
            assert all(k in calls for k in (t,)) and (t == 1 or t - 1 in calls)   # it saw both sides of the edge


def test_the_worst_layer_alone_costs_one_gate_and_a_list_that_never_passes_is_said():
    calls: list[int] = []
    assert fx.shortest_passing_prefix(50, _fake_gate(["a"] * 50, {"a"}, calls)).found == 1 and calls == [1]
    calls = []
    search = fx.shortest_passing_prefix(50, _fake_gate([str(i) for i in range(50)], {"missing"}, calls))
    assert search.found is None and calls == [1, 2, 4, 8, 16, 32, 50]        # doubling up to the whole list
    assert [ok for _, ok in search.tried] == [False] * 7
    assert fx.shortest_passing_prefix(0, _fake_gate([], set(), [])).found is None


# --- which layers, which nodes ------------------------------------------------------------------------------


def _layer(tensor, sqnr, **kw):
    return Layer(tensor, kw.pop("op", "Conv"), sqnr, 0.9, 1.0, kw.pop("saturation", None), **kw)


def test_tiers_are_merged_by_rank_each_tensor_once():
    a, b, c, d = (_layer(n, 5.0) for n in "abcd")
    merged = fx.merge_ranked([[a, b, c], [d, a], []])
    assert [x.tensor for x in merged] == ["a", "d", "b", "c"]


def test_a_layer_is_its_qdq_pair_the_writer_and_every_reader(mlp_set):
    graph = onnx.load(mlp_set["default_range"]).graph
    layer = _layer(models.TENSOR, 3.0, candidate_tensor="r_QuantizeLinear_Output", nodes=["fc2"])
    assert fx.layer_nodes(graph, layer) == ["fc2", "add1"]      # the explanation's node first, then the writer
    # found from the FP32 name alone too (another pairing may dump the float tensor)
    assert set(fx.layer_nodes(graph, _layer(models.TENSOR, 3.0))) == {"add1", "fc2"}


def test_steps_that_add_no_node_are_left_out():
    layers = [_layer(n, 1.0) for n in ("r", "h0", "y0", "x")]
    nodes = {"r": ["add1", "fc2"], "h0": ["fc1", "add1"], "y0": ["fc2"], "x": []}
    steps, left = fx.float_steps(layers, lambda layer: nodes[layer.tensor])
    assert [(s.tensor, s.nodes) for s in steps] == [("r", ["add1", "fc2"]), ("h0", ["fc1"])]
    assert left == ["y0", "x"] and fx.nodes_of(steps) == ["add1", "fc2", "fc1"]


def test_the_candidates_own_ranges_remade_by_onnxruntime_reproduce_it(mlp_set, tmp_path):
    """(2) starts from the candidate's own defect: its ranges as TensorQuantOverrides, the reference
    re-quantized with them matches it; the defect's pair in float, it matches the FP32 reference far better."""
    from tiergate.orchestrator.explain_ab import candidate_ranges, host_sqnr, quant_settings, requantize

    overrides, missed = candidate_ranges(mlp_set["default_range"], mlp_set["fp32"])
    assert missed == [] and set(overrides) == {"x", "h0", "r", "y0", "y"}   # y: named by its DequantizeLinear
    (r,) = overrides["r"]
    assert float(r["scale"]) == pytest.approx(12 / 255, rel=1e-5) and int(r["zero_point"]) == 128
    settings = quant_settings(mlp_set["default_range"], mlp_set["fp32"])
    assert settings["pre_process"] is False and settings["format"] == "QDQ"
    remade = requantize(mlp_set["fp32"], tmp_path / "own.onnx", mlp_set["cal"], settings, [], overrides=overrides)
    assert host_sqnr(remade, mlp_set["default_range"], mlp_set["eval"]) > 60          # the same model
    broken = host_sqnr(remade, mlp_set["fp32"], mlp_set["eval"])
    fixed = requantize(mlp_set["fp32"], tmp_path / "fixed.onnx", mlp_set["cal"], settings, ["add1", "fc2"],
                       overrides=overrides)
    assert "r_QuantizeLinear" not in {n.name for n in onnx.load(fixed).graph.node}      # the pair is gone
    assert host_sqnr(fixed, mlp_set["fp32"], mlp_set["eval"]) > broken + 10
    percentile = requantize(mlp_set["fp32"], tmp_path / "p.onnx", mlp_set["cal"], settings, [],
                            method="percentile", percentile=99.99)
    assert host_sqnr(percentile, mlp_set["fp32"], mlp_set["eval"]) > broken + 10


# --- verdicts, the table, its JSON ---------------------------------------------------------------------------


def _check(dc, name, passed, *, interval=None, inconclusive=False, value=1.0):
    return Check(dc, "t", name, value, 0.99, ">=", passed, interval=interval, inconclusive=inconclusive)


def test_a_tier_verdict_carries_its_interval_and_ignores_the_ab():
    iv = Interval(0.97, 0.95, 0.99, 0.95, "paired")
    decision = SimpleNamespace(metrics={}, checks=[
        _check(X86, "run", True), _check(X86, "accuracy_ratio", False, interval=iv),
        _check(ARM, "accuracy_ratio", False, interval=iv, inconclusive=True),
        _check(ARM, "noninferior_latency", False), _check(X86, "noninferior_accuracy", False)])
    verdicts = fx.tier_verdicts(decision, [X86, ARM, "absent"])
    assert set(verdicts) == {X86, ARM}
    assert verdicts[X86].verdict == fx.FAIL and verdicts[ARM].verdict == fx.INCONCLUSIVE
    assert (verdicts[X86].check, verdicts[X86].low, verdicts[X86].high) == ("accuracy_ratio", 0.95, 0.99)
    assert verdicts[X86].text() == "fail accuracy_ratio 0.97 [0.95, 0.99]"
    passing = SimpleNamespace(metrics={}, checks=[_check(X86, "accuracy_ratio", True, interval=iv),
                                                  _check(X86, "noninferior_latency", False)])
    assert fx.tier_verdicts(passing, [X86])[X86].verdict == fx.PASS


def test_a_tier_cell_shows_the_task_metric_s_interval_the_failing_one_first():
    """The interval a tier's cell shows is the task's (a --metric, an output kind's), not a latency ratio's that
    came first; of several task checks, one that does not pass."""
    lat, iou, cer = (Interval(v, v - 0.01, v + 0.01, 0.95, "paired") for v in (1.1, 1.02, 0.8))
    metrics = {X86: SimpleNamespace(task={"mask_iou": None, "cer": None}, emulated=False, latency={})}
    decision = SimpleNamespace(metrics=metrics, checks=[
        _check(X86, "latency_ratio", True, interval=lat), _check(X86, "mask_iou_ratio", True, interval=iou),
        _check(X86, "cer_difference", False, interval=cer)])
    assert fx.tier_verdicts(decision, [X86])[X86].check == "cer_difference"
    decision.checks[2] = _check(X86, "cer_difference", True, interval=cer)
    shown = fx.tier_verdicts(decision, [X86])[X86]
    assert shown.check == "mask_iou_ratio" and shown.text() == "pass mask_iou_ratio 1.02 [1.01, 1.03]"


def _fix(name, passes, layers=0, size=1000, method=fx.RECALIBRATED):
    tiers = {X86: fx.TierVerdict(fx.PASS if passes else fx.FAIL, "accuracy_ratio", 0.99, 0.98, 1.0, 0.95, 0.99,
                                 latency_ms=0.5),
             ARM: fx.TierVerdict(fx.PASS if passes else fx.NOT_GATED, emulated=True)}
    return fx.Fix(name, method, f"/out/{name}.onnx", "entropy", passes, "PROMOTE" if passes else "REJECT", tiers,
                  size, [fx.FloatLayer(f"t{i}", [f"n{i}"]) for i in range(layers)], gates=3 if layers else 1)


def test_smallest_first_passing_then_layers_then_size():
    fixes = [_fix("big-float", True, layers=3, size=900), _fix("fail", False, size=10),
             _fix("recal-b", True, size=1200), _fix("recal-a", True, size=1100), _fix("one-float", True, layers=1)]
    assert [f.name for f in fx.order_fixes(fixes)] == ["recal-a", "recal-b", "one-float", "big-float", "fail"]


def _report():
    return fx.FixReport("cal.npz", {"format": "QDQ"}, _fix("int8", False, method=fx.CANDIDATE),
                        fx.order_fixes([_fix("float-set", True, layers=1, method=fx.FLOAT_SET),
                                        _fix("recal-entropy", True)]),
                        ranked_layers=["t0"], gates_run=4, notes=["a note"])


def test_the_report_round_trips_and_the_explanation_stays_backward_compatible():
    report = _report()
    doc = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert doc["passing"] == ["recal-entropy", "float-set"] and doc["fixes"][1]["float_nodes"] == ["n0"]
    assert fx.FixReport.from_json(doc) == report
    explanation = Explanation("c.onnx", "r.onnx", {X86: TierExplain(X86, 20.0, [_layer("t0", 3.0)], "t0")})
    old = explanation.to_json()
    assert "fixes" not in old and Explanation.from_json(old).fixes is None     # an explanation from before --fix
    explanation.fixes = doc
    again = Explanation.from_json(json.loads(explanation.dumps()))
    assert again.fixes == doc and again.to_json() == explanation.to_json()


def test_the_table_in_text_markdown_and_html():
    from tiergate.reports.explain_html import render_html

    header, table = fx.rows(_report())
    assert header[3:5] == [X86, ARM] and [row[0] for row in table] == ["int8", "recal-entropy", "float-set"]
    assert table[0][3:5] == ["fail accuracy_ratio 0.99 [0.98, 1], 0.500 ms", "not gated"] and table[0][2] == "no"
    assert table[1][4] == "pass" and table[1][5] == "1,000 B"             # emulated: no latency shown
    assert table[2][6] == "1: t0 (n0)" and table[1][6] == "0" and table[2][7] == "3"
    explanation = Explanation("c.onnx", "r.onnx", {X86: TierExplain(X86, 20.0, [_layer("t0", 3.0)], "t0")},
                              fixes=_report().to_json())
    md = markdown_table(explanation)
    assert "## Candidates that fix it, smallest first" in md and "| float-set | float set (entropy) | yes |" in md
    html = render_html(explanation)
    assert "Candidates that fix it" in html and "<tr class='pass'><td class='l'>recal-entropy</td>" in html


def test_a_qoperator_candidate_is_remade_as_qoperator_from_its_own_ranges(mlp_set, tmp_path):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from tiergate.orchestrator.explain_ab import candidate_ranges, host_sqnr, quant_settings, requantize

    qop = tmp_path / "qop.onnx"
    quantize_static(str(mlp_set["fp32"]), str(qop), modelkit._Calibration(dict(np.load(mlp_set["cal"]))),
                    quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    settings = quant_settings(qop, mlp_set["fp32"])
    assert settings["format"] == "QOperator"              # its QuantizeLinear at the input does not make it QDQ
    overrides, missed = candidate_ranges(qop, mlp_set["fp32"])
    assert missed == [] and {"x", "h0", "y0", "y"} <= set(overrides)
    remade = requantize(mlp_set["fp32"], tmp_path / "re.onnx", mlp_set["cal"], settings, [], overrides=overrides)
    assert host_sqnr(remade, qop, mlp_set["eval"]) > 60
    fc2_float = requantize(mlp_set["fp32"], tmp_path / "f.onnx", mlp_set["cal"], settings, ["fc2"],
                           overrides=overrides)
    assert [n.op_type for n in onnx.load(fc2_float).graph.node if n.name == "fc2"] == ["MatMul"]
