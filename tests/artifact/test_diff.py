"""Position-matched diffs: what was added, removed or changed, and by which parameter."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

import modelkit as m
from tiergate.artifact import load_artifact
from tiergate.diff import diff_artifacts


def _load(model, tmp_path, name):
    return load_artifact(m.save(model, name, tmp_path))


def test_renamed_copy_is_identical(tmp_path):
    d = diff_artifacts(_load(m.conv_net(), tmp_path, "a.onnx"), _load(m.renamed(m.conv_net()), tmp_path, "b.onnx"))
    assert d.identical and not d.added and not d.removed and not d.changed and not d.op_counts


def test_inserted_identity_is_one_added_node(tmp_path):
    old, new = _load(m.conv_net(), tmp_path, "a.onnx"), _load(m.conv_net(identity=True), tmp_path, "b.onnx")
    d = diff_artifacts(old, new)
    assert not d.identical and d.same == {"structure": False, "weights": True, "quantization": True}
    assert [(n.index, n.op) for n in d.added] == [(1, "Identity")] and not d.removed
    assert d.op_counts == {"Identity": (0, 1)}
    # the activation after it is rewired to the Identity, and nothing else changed
    assert [(c.old_index, c.new_index, c.op, [x.what for x in c.changes]) for c in d.changed] == [
        (1, 2, "LeakyRelu", ["inputs"])]


def test_attribute_change_names_the_attribute(tmp_path):
    d = diff_artifacts(_load(m.conv_net(), tmp_path, "a.onnx"), _load(m.conv_net(alpha=0.3), tmp_path, "b.onnx"))
    (change,) = d.changed
    (what,) = change.changes
    assert (change.op, what.what, what.key) == ("LeakyRelu", "attribute", "alpha")
    assert float(what.old) != float(what.new)


def test_weight_change_names_the_input_slot(tmp_path):
    changed = m.conv_net()
    w3 = next(t for t in changed.graph.initializer if t.name == "w3")
    w3.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w3) * np.float32(2), "w3"))
    d = diff_artifacts(_load(m.conv_net(), tmp_path, "a.onnx"), _load(changed, tmp_path, "b.onnx"))
    assert [(c.op, c.new_index, [(x.what, x.key) for x in c.changes]) for c in d.changed] == [
        ("Conv", 4, [("weights", "in1")])]


def test_scale_changes_are_reported_per_quantize_node(tmp_path):
    old = load_artifact(m.quantized_path())
    new = _load(m.with_activation_scales(m.quantized_net(), 12 / 255, 128), tmp_path, "d.onnx")
    d = diff_artifacts(old, new)
    assert d.same == {"structure": True, "weights": True, "quantization": False}
    # each activation scale is shared by its QuantizeLinear and the DequantizeLinear after it
    assert {c.op for c in d.changed} == {"QuantizeLinear", "DequantizeLinear"}
    assert all({x.what for x in c.changes} == {"quantization"} for c in d.changed)
    assert any("0.0470588" in x.new for c in d.changed for x in c.changes)


def test_quantized_versus_float_counts(tmp_path):
    d = diff_artifacts(_load(m.conv_net(), tmp_path, "a.onnx"), load_artifact(m.quantized_path(exclude_middle=True)))
    assert d.precision["old"] == {"quantized": 0, "float": 5}
    assert d.precision["new"]["float"] == 2 and d.precision["new"]["quantized"] == 3
    assert d.op_counts["QuantizeLinear"][0] == 0 and d.op_counts["QuantizeLinear"][1] > 0


def test_tflite_split_activation(tmp_path):
    old = load_artifact(m.save_tflite(m.tflite_bytes("float"), "a.tflite", tmp_path))
    new = load_artifact(m.save_tflite(m.tflite_unfused(False), "b.tflite", tmp_path))
    d = diff_artifacts(old, new)
    assert [n.op for n in d.added] == ["RELU"]
    first = next(c for c in d.changed if c.old_index == 0)
    assert ("attribute", "fused_activation_function", '"RELU"', '"NONE"') in [
        (x.what, x.key, x.old, x.new) for x in first.changes]


def test_to_json_is_plain_data(tmp_path):
    import json

    d = diff_artifacts(_load(m.conv_net(), tmp_path, "a.onnx"), _load(m.conv_net(identity=True), tmp_path, "b.onnx"))
    doc = json.loads(json.dumps(d.to_json()))
    assert doc["identical"] is False and doc["added"][0]["op"] == "Identity"
    assert doc["op_counts"]["Identity"] == {"old": 0, "new": 1, "delta": 1}
