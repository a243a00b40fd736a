"""Every lint rule on tiny generated models: the model that must be flagged and its clean
twin, for ONNX and TFLite. Where a runtime can confirm a finding, the test asks it."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

import modelkit as m
from tiergate.artifact import load_artifact
from tiergate.lint import Finding, lint, rule_ids
from tiergate.lint import tflite_coverage
from tiergate.lint.rules.external_data_escape import location_problem
from tiergate.targets import resolve


def onnx_art(model, name):
    return load_artifact(m.save(model, name))


def tflite_art(data, name):
    return load_artifact(m.save_tflite(data, name))


def found(artifact, rule, device_class=None) -> list[Finding]:
    return [f for f in lint(artifact, device_class) if f.rule == rule]


def ops_of(artifact, finding) -> list[str]:
    return [artifact.nodes[i].op for i in finding.nodes]


def test_registry_lists_every_rule():
    assert set(rule_ids()) == {"unfused-activation", "unfolded-batchnorm", "float-island",
                               "default-calibration-range", "collapsed-calibration-range", "unsupported-op", "external-data-escape",
                               "provider-fallback", "layout-reorder", "mixed-range-scale", "dynamic-quantization",
                               "npu-fallback"}


# ---------------------------------------------------------------- unfused-activation

def test_unfused_activation_onnx_seed_story():
    flagged = onnx_art(m.conv_net(batchnorm=True, identity=True), "seed.onnx")
    (f,) = found(flagged, "unfused-activation")
    assert ops_of(flagged, f) == ["BatchNormalization", "Identity", "LeakyRelu"] and f.severity == "warning"
    assert f.node_names == ("bn1", "pass_inserted", "act1")
    assert found(onnx_art(m.conv_net(batchnorm=True), "seed_twin.onnx"), "unfused-activation") == []


def test_unfused_activation_tflite():
    for noop, expected in ((True, ["CONV_2D", "RESHAPE", "RELU"]), (False, ["CONV_2D", "RELU"])):
        flagged = tflite_art(m.tflite_unfused(noop), f"unfused_{noop}.tflite")
        (f,) = found(flagged, "unfused-activation")
        assert ops_of(flagged, f) == expected
    assert found(tflite_art(m.tflite_bytes("float"), "float.tflite"), "unfused-activation") == []


# ---------------------------------------------------------------- unfolded-batchnorm

def test_unfolded_batchnorm_onnx():
    flagged = onnx_art(m.conv_net(batchnorm=True), "bn.onnx")
    (f,) = found(flagged, "unfolded-batchnorm")
    assert ops_of(flagged, f) == ["Conv", "BatchNormalization"]
    assert found(onnx_art(m.conv_net(), "bn_twin.onnx"), "unfolded-batchnorm") == []


def test_unfolded_batchnorm_tflite():
    flagged = tflite_art(m.tflite_unfolded_bn(), "bn.tflite")
    (f,) = found(flagged, "unfolded-batchnorm")
    assert ops_of(flagged, f) == ["CONV_2D", "MUL", "ADD"]
    assert found(tflite_art(m.tflite_bytes("float"), "float.tflite"), "unfolded-batchnorm") == []


# ---------------------------------------------------------------- float-island

def test_float_island_onnx():
    flagged = load_artifact(m.quantized_path(exclude_middle=True))
    (f,) = found(flagged, "float-island")
    assert f.node_names == ("conv2", "act2") and ops_of(flagged, f) == ["Conv", "Relu"]
    assert found(load_artifact(m.quantized_path()), "float-island") == []
    assert found(onnx_art(m.conv_net(), "all_float.onnx"), "float-island") == []  # float graphs have no islands


def test_float_island_tflite():
    flagged = tflite_art(m.tflite_bytes("island"), "island.tflite")
    (f,) = found(flagged, "float-island")
    assert ops_of(flagged, f) == ["SIN"]
    assert found(tflite_art(m.tflite_bytes("int8_io_float"), "island_twin.tflite"), "float-island") == []


# ---------------------------------------------------------------- default-calibration-range

def test_default_calibration_range_onnx():
    flagged = onnx_art(m.with_activation_scales(m.quantized_net(), 12 / 255, 128), "default.onnx")
    (f,) = found(flagged, "default-calibration-range")
    assert f.severity == "error" and "(-6, 6)" in f.message
    assert set(ops_of(flagged, f)) == {"QuantizeLinear"} and len(f.nodes) == 5
    assert found(load_artifact(m.quantized_path()), "default-calibration-range") == []


def test_collapsed_calibration_ranges_onnx(tmp_path):
    """Calibration data that never exercised a tensor: a softmax quantized in steps of 1 (onnxruntime's scale for a
    tensor it saw only as zero: the blank-page detector's probability map), and a model calibrated on inputs of
    about 1e-4 (the input's whole range 0.0007 wide). The twin calibrated on real inputs is clean."""
    import numpy as np

    fp32 = m.save(m.linear(np.random.default_rng(0).normal(size=(4, 3)), softmax=True), "softmax.onnx", tmp_path)
    real = {"x": np.random.default_rng(1).normal(size=(16, 4)).astype(np.float32)}
    clean = m.quantize_qdq(fp32, tmp_path / "clean.onnx", real)
    assert found(load_artifact(clean), "collapsed-calibration-range") == []
    model = onnx.load(clean)
    writer = {o: n for n in model.graph.node for o in n.output}
    (q,) = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and writer.get(n.input[0]) is not None
            and writer[n.input[0]].op_type == "Softmax"]
    scale = next(t for t in model.graph.initializer if t.name == q.input[1])
    scale.CopyFrom(onnx.numpy_helper.from_array(np.array(1.0, np.float32), scale.name))
    flagged = onnx_art(model, "collapsed.onnx")
    (f,) = found(flagged, "collapsed-calibration-range")
    assert f.severity == "error" and "Softmax output in [0, 1] quantized over [0, 255]" in f.message
    assert ops_of(flagged, f) == ["Softmax"]
    tiny = load_artifact(m.quantize_qdq(fp32, tmp_path / "tiny.onnx", {"x": real["x"] * 1e-4}))
    (f,) = found(tiny, "collapsed-calibration-range")
    assert "x: quantized over" in f.message and ops_of(tiny, f)[0] == "QuantizeLinear"


def test_identical_ranges_across_many_tensors_onnx():
    flagged = onnx_art(m.with_activation_scales(m.quantized_net(), 0.0311, 100), "same.onnx")
    (f,) = found(flagged, "default-calibration-range")
    assert f.severity == "warning" and "share one range" in f.message and len(f.nodes) == 5


def test_default_calibration_range_tflite():
    flagged = tflite_art(m.tflite_activation_ranges(12 / 255, 0), "default.tflite")
    (f,) = found(flagged, "default-calibration-range")
    assert f.severity == "error" and "(-6, 6)" in f.message
    shared = tflite_art(m.tflite_activation_ranges(0.0377, -5), "same.tflite")
    assert [g.severity for g in found(shared, "default-calibration-range")] == ["warning"]
    assert found(tflite_art(m.tflite_bytes("int8"), "int8.tflite"), "default-calibration-range") == []


# ---------------------------------------------------------------- unsupported-op

def _session_error(path) -> str | None:
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return None
    except Exception as exc:  # noqa: BLE001
        return str(exc)


def test_unsupported_op_onnx_agrees_with_onnxruntime():
    cpu = resolve("x86_64-cpu-onnxruntime")[0]
    flagged = onnx_art(m.unary_net("Det", TensorProto.DOUBLE), "det64.onnx")
    (f,) = found(flagged, "unsupported-op", cpu)
    assert f.severity == "error" and "Det" in f.message and "double" in f.message
    assert "NOT_IMPLEMENTED" in _session_error(flagged.path)
    clean = onnx_art(m.unary_net("Det"), "det32.onnx")
    assert found(clean, "unsupported-op", cpu) == [] and _session_error(clean.path) is None


def test_unsupported_op_onnx_fallbacks_are_not_errors():
    fp16 = onnx_art(m.unary_net("Sin", TensorProto.FLOAT16), "sin16.onnx")
    assert [(f.severity, "Casts" in f.message) for f in found(fp16, "unsupported-op")] == [("warning", True)]
    assert _session_error(fp16.path) is None  # onnxruntime does run it, through inserted Casts
    hswish = onnx_art(m.unary_net("HardSwish"), "hswish.onnx")
    assert [f.severity for f in found(hswish, "unsupported-op")] == ["info"]


def test_unsupported_op_gpu_class_without_cuda_kernels_says_so():
    gpu = resolve("cuda-gpu-onnxruntime")[0]
    findings = found(onnx_art(m.conv_net(), "gpu.onnx"), "unsupported-op", gpu)
    if ort.get_device() == "GPU":
        pytest.skip("this onnxruntime has CUDA kernels: the CPU-only note does not apply")
    assert [f.severity for f in findings] == ["info"] and "CUDA" in findings[0].message


def test_unsupported_op_wrong_runtime_for_format():
    findings = found(onnx_art(m.conv_net(), "fmt.onnx"), "unsupported-op", resolve("x86_64-cpu-tflite")[0])
    assert [f.severity for f in findings] == ["error"] and "cannot run" in findings[0].message


def test_unsupported_op_tflite_custom_agrees_with_litert():
    interpreter = pytest.importorskip("ai_edge_litert.interpreter")
    flagged = tflite_art(m.tflite_custom_op(), "custom.tflite")
    (f,) = found(flagged, "unsupported-op", resolve("x86_64-cpu-tflite")[0])
    assert f.severity == "error" and "TiergateMysteryOp" in f.message
    with pytest.raises(RuntimeError, match="unresolved custom op"):
        interpreter.Interpreter(model_path=str(flagged.path)).allocate_tensors()
    assert found(tflite_art(m.tflite_bytes("float"), "float.tflite"), "unsupported-op") == []


def test_a_custom_op_the_installed_litert_loads_is_a_warning_one_it_cannot_load_an_error():
    from types import SimpleNamespace

    node = SimpleNamespace(domain="custom", op="Convolution2DTransposeBias", index=3)
    severity, message = tflite_coverage.classify(node, {3})
    assert severity == "warning" and "XNNPACK delegate takes it" in message
    assert tflite_coverage.classify(node, set())[0] == "warning"        # loaded: something resolves it
    assert tflite_coverage.classify(node, None)[0] == "error"           # the installed LiteRT cannot load it


def test_unsupported_op_tflite_xnnpack_fallback():
    pytest.importorskip("ai_edge_litert.interpreter")
    flagged = tflite_art(m.tflite_bytes("argmax"), "argmax.tflite")
    findings = found(flagged, "unsupported-op")
    assert {ops_of(flagged, f)[0] for f in findings} >= {"ARG_MAX"}
    assert all(f.severity == "warning" and "XNNPACK" in f.message for f in findings)
    delegated = tflite_coverage.delegated_nodes(flagged)
    assert 0 in delegated and 1 not in delegated  # the conv is taken, ARG_MAX is not


def test_xnnpack_static_list_is_used_without_litert():
    argmax = tflite_art(m.tflite_bytes("argmax"), "argmax.tflite")
    verdicts = [tflite_coverage.classify(n, None) for n in argmax.nodes]
    assert verdicts[0] is None and verdicts[1][0] == "warning" and "static" in verdicts[1][1]


# ---------------------------------------------------------------- external-data-escape

def _external(folder, location: str):
    import onnx

    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(m.conv_net(), folder / "model.onnx", save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    for t in model.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, folder / "model.onnx")
    return folder / "model.onnx"


def test_external_data_escape_onnx(tmp_path):
    absolute = _external(tmp_path / "abs", str((tmp_path / "abs" / "weights.bin").resolve()))
    (f,) = found(load_artifact(absolute), "external-data-escape")
    assert f.severity == "error" and "absolute" in f.message
    clean = _external(tmp_path / "rel", "weights.bin")
    assert found(load_artifact(clean), "external-data-escape") == []


def test_external_data_escape_tflite_has_no_external_data():
    artifact = tflite_art(m.tflite_bytes("float"), "float.tflite")
    assert artifact.external_data == () and found(artifact, "external-data-escape") == []


def test_location_problems(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "w.bin").write_bytes(b"x")
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert location_problem(tmp_path, "real/w.bin") is None
    assert "'..'" in location_problem(tmp_path, "real/../real/w.bin")
    assert "symbolic link" in location_problem(tmp_path, "link/w.bin")
    assert "absolute" in location_problem(tmp_path, "/etc/passwd")


# ---------------------------------------------------------------- findings

def test_findings_are_ordered_and_serialisable():
    findings = lint(onnx_art(m.conv_net(batchnorm=True, identity=True), "seed.onnx"),
                    resolve("x86_64-cpu-tflite")[0])
    assert [f.severity for f in findings] == ["error", "warning", "warning"]
    doc = findings[1].to_json()
    assert set(doc) == {"rule", "severity", "message", "nodes", "node_names", "basis", "target"} and doc["nodes"] == [0, 1]
    with pytest.raises(ValueError):
        Finding("x", "fatal", "bad severity")


# ---------------------------------------------------------------- no false errors at file level

def _with_constant_weights(model):
    """conv_net with its weights in Constant nodes (as PaddleOCR and silero VAD export them)."""
    from onnx import helper

    out = type(model)()
    out.CopyFrom(model)
    graph = out.graph
    consts = [helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t) for t in graph.initializer]
    del graph.initializer[:]
    nodes = consts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def test_constant_nodes_are_never_unsupported():
    art = onnx_art(_with_constant_weights(m.conv_net()), "constants.onnx")
    assert art.op_counts["Constant"] == 6
    assert _session_error(art.path) is None  # onnxruntime folds them at load
    for dc in (None, resolve("x86_64-cpu-onnxruntime")[0]):
        assert [f for f in lint(art, dc) if f.severity == "error"] == []


def test_file_level_rules_say_they_judge_the_file_only():
    from tiergate.lint.finding import FILE_ONLY

    art = onnx_art(m.conv_net(batchnorm=True, identity=True), "seed_file.onnx")
    judged = [f for f in lint(art) if f.rule in ("unfused-activation", "unfolded-batchnorm")]
    assert {f.rule for f in judged} == {"unfused-activation", "unfolded-batchnorm"}
    assert all(f.severity == "warning" and f.basis == "file" and FILE_ONLY in f.message for f in judged)
