"""Fingerprints: three hashes kept apart, stable across a re-save, invariant to names and
initializer order, and each moved only by its own kind of change."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

import modelkit as m
from tiergate.artifact import load_artifact
from tiergate.fingerprint import fingerprint


def _fp(model, tmp_path, name):
    return fingerprint(load_artifact(m.save(model, name, tmp_path)))


def _moved(a, b) -> set[str]:
    return {part for part in ("structure", "weights", "quantization") if getattr(a, part) != getattr(b, part)}


def test_stable_across_a_resave(tmp_path):
    first = load_artifact(m.save(m.conv_net(), "a.onnx", tmp_path))
    onnx.save(onnx.load(first.path), tmp_path / "b.onnx")
    assert fingerprint(first) == fingerprint(load_artifact(tmp_path / "b.onnx"))


def test_invariant_to_names_and_initializer_order(tmp_path):
    model = m.conv_net(batchnorm=True)
    renamed = m.renamed(model)
    assert [t.name for t in renamed.graph.initializer] != [t.name for t in model.graph.initializer]
    assert _fp(model, tmp_path, "a.onnx") == _fp(renamed, tmp_path, "b.onnx")


def test_attribute_change_moves_only_structure(tmp_path):
    a, b = _fp(m.conv_net(), tmp_path, "a.onnx"), _fp(m.conv_net(alpha=0.2), tmp_path, "b.onnx")
    assert _moved(a, b) == {"structure"} and a.combined != b.combined


def test_inserted_identity_moves_only_structure(tmp_path):
    a, b = _fp(m.conv_net(), tmp_path, "a.onnx"), _fp(m.conv_net(identity=True), tmp_path, "b.onnx")
    assert _moved(a, b) == {"structure"}


def test_one_weight_change_moves_only_weights(tmp_path):
    model = m.conv_net()
    changed = m.conv_net()
    w2 = changed.graph.initializer[2]
    array = numpy_helper.to_array(w2).copy()
    array.flat[5] += np.float32(1e-3)
    w2.CopyFrom(numpy_helper.from_array(array, w2.name))
    assert _moved(_fp(model, tmp_path, "a.onnx"), _fp(changed, tmp_path, "b.onnx")) == {"weights"}


def test_scale_change_moves_only_quantization(tmp_path):
    calibrated = fingerprint(load_artifact(m.quantized_path()))
    defaulted = _fp(m.with_activation_scales(m.quantized_net(), 12 / 255, 128), tmp_path, "d.onnx")
    assert _moved(calibrated, defaulted) == {"quantization"}


def test_float_and_quantized_differ_everywhere(tmp_path):
    assert _moved(_fp(m.conv_net(), tmp_path, "a.onnx"), fingerprint(load_artifact(m.quantized_path()))) == {
        "structure", "weights", "quantization"}


def test_tflite_repack_is_stable_and_changes_are_kept_apart(tmp_path):
    original = m.tflite_bytes("int8")
    repacked = m.tflite_resaved(original)
    assert repacked != original  # renamed tensors, buffers in another order: the same model
    fp = fingerprint(load_artifact(m.save_tflite(original, "a.tflite", tmp_path)))
    assert fp == fingerprint(load_artifact(m.save_tflite(repacked, "b.tflite", tmp_path)))
    rescaled = fingerprint(load_artifact(m.save_tflite(m.tflite_activation_ranges(0.05, 3), "c.tflite", tmp_path)))
    assert _moved(fp, rescaled) == {"quantization"}
    unfused = fingerprint(load_artifact(m.save_tflite(m.tflite_unfused(False), "d.tflite", tmp_path)))
    float_fp = fingerprint(load_artifact(m.save_tflite(m.tflite_bytes("float"), "e.tflite", tmp_path)))
    assert _moved(float_fp, unfused) == {"structure"}


def test_to_json_shape(tmp_path):
    fp = _fp(m.conv_net(), tmp_path, "a.onnx")
    doc = fp.to_json()
    assert set(doc) == {"structure", "weights", "quantization", "combined"}
    assert all(len(doc[k]) == 64 for k in ("structure", "weights", "quantization")) and len(doc["combined"]) == 16


def test_dynamic_quantization_is_quantization(tmp_path):
    """Issue 41: a dynamically quantized model (onnxruntime's quantize_dynamic: DynamicQuantizeLinear before
    MatMulInteger) was `quantized=false` with the quantization hash of nothing; its weights' zero points and scales
    and its run-time activations are quantization, and a change of them moves only that hash."""
    import hashlib

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from tiergate.diff import diff_artifacts
    from tiergate.lint import lint

    fp32 = m.save(m.mlp(features=16, outputs=8), "mlp.onnx", tmp_path)
    per_tensor, per_channel = tmp_path / "dyn.onnx", tmp_path / "dyn_pc.onnx"
    quantize_dynamic(str(fp32), str(per_tensor), weight_type=QuantType.QInt8)
    quantize_dynamic(str(fp32), str(per_channel), weight_type=QuantType.QInt8, per_channel=True)
    art = load_artifact(per_tensor)
    assert art.is_quantized
    runtime = [q for q in art.quant.values() if not q.scale]
    weights = [q for q in art.quant.values() if q.scale and q.tensor in art.initializers]
    assert runtime and weights and all(q.dtype == "int8" for q in weights)
    a, b = fingerprint(art), fingerprint(load_artifact(per_channel))
    assert a.quantization != hashlib.sha256().hexdigest()           # the hash of empty input: nothing seen
    assert "quantization" in _moved(a, b)
    changes = diff_artifacts(art, load_artifact(per_channel))
    assert not changes.same["quantization"]
    assert any(c.what == "quantization" for node in changes.changed for c in node.changes)
    findings = {f.rule: f for f in lint(art)}
    assert findings["dynamic-quantization"].severity == "info" and "float-island" not in findings
