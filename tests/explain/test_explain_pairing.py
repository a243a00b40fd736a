"""Pairing by what the tensors are (tiergate.explain.onnx_pairing) on models made by onnxruntime's own quantize_static
in every form (QDQ and QOperator, per-tensor and per-channel weights, with and without quant_pre_process), each with
two defects in the middle of the network (pairing_models.py): `first_divergent` names that tensor. The dumps run
with this machine's onnxruntime (HostRunner); test_explain_pairing_tiers.py runs a subset in the tiers' containers."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelkit
import pairing_models as pm
from tiergate.execution.explain import HostRunner, explain
from tiergate.explain import markdown_table, plan
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"
VARIANTS = pm.variants()


@pytest.fixture(scope="session")
def variant_models(tmp_path_factory):
    """variant -> its models (made on first use, once per session)."""
    folder = tmp_path_factory.mktemp("pairing-models")
    made = {}

    def get(variant):
        if variant not in made:
            made[variant] = pm.write_variant(folder, variant)
        return made[variant]

    return get


def _explain(candidate, paths, samples=8):
    return explain(candidate, paths["fp32"], paths["eval"], resolve(X86), runner=HostRunner(),
                   samples=samples).targets[X86]


def _graph_nodes(path) -> set[str]:
    return {n.name for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("variant", VARIANTS, ids=pm.variant_id)
def test_every_fp32_tensor_is_paired_or_said_why(variant_models, variant, tmp_path):
    """The well-quantized INT8: each FP32 activation is paired or fused into a candidate kernel (and said so); the
    middle tensor pairs with an integer tensor (dequantized with its scale: fused kernels stay fused); node names are
    the candidate's own, with their FP32 counterparts beside them."""
    paths = variant_models(variant)
    model, fmt = variant[:2]
    the_plan = plan(paths["int8"], paths["fp32"], tmp_path)
    fp32_tensors = {o for n in onnx.load(str(paths["fp32"])).graph.node for o in n.output} | {"x"}
    paired = {s.fp32 for s in the_plan.sources}
    assert paired | set(the_plan.fp32_unpaired) == fp32_tensors
    assert all(why.startswith("fused into the candidate's ") for why in the_plan.fp32_unpaired.values())
    assert the_plan.unpaired == [] and the_plan.reasons == {}
    middle = next(s for s in the_plan.sources if s.fp32 == pm.TENSOR[model])
    assert middle.scale is not None and middle.dtype == "uint8"
    before, after = pm.LAYERS[model]
    own = _graph_nodes(paths["int8"])
    assert set(middle.nodes) <= own and set(middle.fp32_nodes) <= _graph_nodes(paths["fp32"])
    assert {before, after} <= set(middle.fp32_nodes)
    if fmt == "QOperator":          # QOperator renames every node: the candidate's names, mapped back
        assert middle.nodes == [f"{before}_quant", f"{after}_quant"]


@pytest.mark.parametrize("defect", ["default_range", "qdq_removed"])
@pytest.mark.parametrize("variant", VARIANTS, ids=pm.variant_id)
def test_a_defect_in_the_middle_is_located(tiergate_home, variant_models, variant, defect):
    paths = variant_models(variant)
    tensor = pm.TENSOR[variant[0]]
    item = _explain(paths[defect], paths)
    table = [(x.tensor, round(x.sqnr_db, 1), x.paired_by) for x in item.layers]
    assert item.first_divergent == tensor, table
    names = [x.tensor for x in item.layers]
    assert names[0] == "x" and names[-1] == "logits" and tensor in names
    # everything before it is clean: the defect is the first loss, not a pairing artefact
    assert all(x.sqnr_db >= 20 for x in item.layers[: names.index(tensor)]), table
    assert item.end_to_end_sqnr_db < item.layers[0].sqnr_db


def test_the_qoperator_default_range_names_the_candidates_nodes(tiergate_home, variant_models):
    """QOperator: the layer in float is named by the candidate's own nodes (keep_float) and by the FP32 reference's
    (keep_float_fp32, what re-quantizing the reference takes); the JSON, Markdown and CLI say what is unpaired."""
    from rich.console import Console

    from tiergate.cli.explain import print_explanation
    from tiergate.explain import Explanation

    paths = variant_models(("mlp", "QOperator", True, True))
    result = explain(paths["default_range"], paths["fp32"], paths["eval"], resolve(X86), runner=HostRunner(),
                     samples=8)
    item = result.targets[X86]
    assert item.first_divergent == "r"
    assert item.keep_float[:2] == ["fc1_quant", "fc2_quant"] and item.keep_float_fp32[:2] == ["fc1", "relu1"]
    layer = next(x for x in item.layers if x.tensor == "r")
    assert layer.candidate_tensor == "h_quantized" and layer.paired_by == "convention" and layer.saturation > 0
    why = "fused into the candidate's fc1_quant (QGemm), which holds r"
    assert item.fp32_unpaired["h"].startswith(why)
    doc = result.to_json()
    assert doc["targets"][X86]["fp32_unpaired"]["h"].startswith(why)
    back = Explanation.from_json(json.loads(json.dumps(doc)))
    assert back.targets[X86].fp32_unpaired == item.fp32_unpaired and back.keep_float(fp32=True) == result.keep_float(fp32=True)
    assert back.targets[X86].layers[1].nodes == layer.nodes and back.targets[X86].layers[1].fp32_nodes == layer.fp32_nodes
    assert f"`h`: {why}" in markdown_table(result)
    out = io.StringIO()
    print_explanation(Console(file=out, width=400), result)
    assert f"h: {why}" in out.getvalue()


def test_an_old_explanation_reads_back(tiergate_home):
    """A recorded explanation from before these fields reads back with them empty."""
    from tiergate.explain import Explanation, unpaired_lines

    doc = {"candidate": "c", "reference": "r", "targets": {X86: {
        "first_divergent": "a", "threshold_db": 20, "end_to_end_sqnr_db": 3.0, "unpaired": ["q"], "skipped": [],
        "suggestions": {"keep_float": ["n"], "calibration": []}, "seconds": 1.0, "machine": "x86_64", "error": "",
        "layers": [{"tensor": "a", "op": "Conv", "sqnr_db": 3.0, "cosine": 0.5, "max_abs_error": 1.0,
                    "saturation": None, "nodes": ["n"]}]}}}
    item = Explanation.from_json(doc).targets[X86]
    assert item.unpaired_reasons == {} and item.fp32_unpaired == {} and item.keep_float_fp32 == []
    assert item.layers[0].fp32_nodes == [] and item.layers[0].paired_by == ""
    assert "  q: no FP32 tensor of the same name; not guessed" in unpaired_lines(item)


def test_renamed_tensors_and_nodes_pair_by_structure_alone(tiergate_home, variant_models, tmp_path):
    """Every tensor and node of the candidate renamed (no name, no quantizer convention left): the walk from the
    inputs, through Q/DQ and the weights themselves, still pairs every layer and finds the defect."""
    paths = variant_models(("cnn", "QDQ", True, True))
    renamed = modelkit.write(modelkit.renamed(onnx.load(str(paths["default_range"]))), tmp_path / "renamed.onnx")
    item = _explain(renamed, paths)
    assert item.first_divergent == "a2", [(x.tensor, x.sqnr_db) for x in item.layers]
    assert {x.paired_by for x in item.layers[1:-1]} == {"structure"}
    assert len(item.layers) == len(_explain(paths["default_range"], paths).layers)
    assert all(n.startswith("renamed_") for x in item.layers for n in x.nodes)


def test_another_models_weights_do_not_pair(tmp_path):
    """Same structure, same input and output names, other weights: the structure alone does not pair the layers (the
    weights say no, and the plan says so); only the input and the output pair, by name."""
    fp32 = modelkit.write(pm.cnn(seed=0), tmp_path / "fp32.onnx")
    other = modelkit.write(modelkit.renamed(pm.cnn(seed=5)), tmp_path / "other.onnx")
    the_plan = plan(other, fp32, tmp_path / "work")
    assert [s.fp32 for s in the_plan.sources] == ["x", "logits"]
    first = the_plan.reasons[the_plan.unpaired[0]] if the_plan.unpaired else ""
    assert any(why.startswith("its weights are not those of the FP32 Conv reading x (conv1)")
               for why in the_plan.reasons.values()), the_plan.reasons
    assert first and the_plan.fp32_unpaired["c1"] == ("the candidate's renamed_conv1 reads what this Conv (conv1) reads, "
                                                      "but its weights are another layer's")


def _per_channel(scales: np.ndarray | None) -> onnx.ModelProto:
    """x [N,4,3,3] -> Conv (1x1) -> c -> Relu -> y; with `scales`, c is quantized per channel (axis 1: a
    QuantizeLinear/DequantizeLinear pair with a scale per channel, zero point 128) before the Relu."""
    c = 4
    inits = [numpy_helper.from_array(np.random.default_rng(0).standard_normal((c, c, 1, 1)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv")]
    relu_in = "c"
    if scales is not None:
        inits += [numpy_helper.from_array(scales.astype(np.float32), "s"),
                  numpy_helper.from_array(np.full(c, 128, np.uint8), "z")]
        nodes += [helper.make_node("QuantizeLinear", ["c", "s", "z"], ["c_q"], name="c_Q", axis=1),
                  helper.make_node("DequantizeLinear", ["c_q", "s", "z"], ["c_dq"], name="c_DQ", axis=1)]
        relu_in = "c_dq"
    nodes.append(helper.make_node("Relu", [relu_in], ["y"], name="relu"))
    graph = helper.make_graph(nodes, "per_channel",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 3, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_an_activation_quantized_per_channel_is_dequantized_per_channel(tiergate_home, tmp_path):
    """The integer tensor is dumped (kernels stay fused) and read with its scale per channel: fine scales pair
    cleanly; one channel's scale too small clips that channel (saturation) and the layer diverges there."""
    ref = modelkit.write(_per_channel(None), tmp_path / "fp32.onnx")
    np.savez(tmp_path / "eval.npz", x=0.5 * np.random.default_rng(1).standard_normal((8, 4, 3, 3)).astype(np.float32))

    def layer_c(scales):
        cand = modelkit.write(_per_channel(np.array(scales)), tmp_path / "cand.onnx")
        item = explain(cand, ref, tmp_path / "eval.npz", resolve(X86), runner=HostRunner()).targets[X86]
        return item, next(x for x in item.layers if x.tensor == "c")

    item, layer = layer_c([0.05, 0.06, 0.07, 0.08])
    assert layer.candidate_tensor == "c_q" and layer.sqnr_db > 25 and layer.saturation == 0.0
    assert layer.range == [-10.24, 10.16] and item.first_divergent is None   # [0, 255] - 128, by the widest scale
    item, layer = layer_c([0.05, 0.001, 0.07, 0.08])
    assert item.first_divergent == "c" and 0.15 < layer.saturation < 0.25      # about the one channel in four


def test_dynamic_quantization_pairs_by_name_and_says_why_its_accumulators_do_not(tmp_path):
    """quantize_dynamic: activations quantized at run time (their scale is in no initializer). Every FP32 tensor pairs
    with the float tensor of its name; the int32 accumulators and their rescaling stand for none, and say why."""
    fp32 = modelkit.write(pm.cnn(), tmp_path / "fp32.onnx")
    dynamic = modelkit.quantize_dynamic_int8(fp32, tmp_path / "dynamic.onnx")
    the_plan = plan(dynamic, fp32, tmp_path / "work")
    assert {s.fp32 for s in the_plan.sources} == {"x"} | {o for n in pm.cnn().graph.node for o in n.output}
    assert all(s.scale is None and not s.scales for s in the_plan.sources) and the_plan.fp32_unpaired == {}
    accumulators = [n for n in the_plan.unpaired if the_plan.reasons[n].startswith("ConvInteger computes on integers "
                                                                                    "quantized at run time")]
    assert len(accumulators) == 3 and set(the_plan.unpaired) > set(accumulators)
