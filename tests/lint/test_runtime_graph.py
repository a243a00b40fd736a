"""Lint on the graph a tier's runtime runs: the describer's output parsed into a RuntimeGraph.

The describer is run here under the host's own onnxruntime (the same pinned version the
x86 runtime image carries) for the fast tests, and in the tier's container (Docker) for
runtime_intake, the function a gate's intake calls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelkit as m
from tiergate.artifact import load_artifact
from tiergate.lint import lint
from tiergate.paths import containers_dir
from tiergate.runtime_graph import first_difference, level_differences, parse_describe
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


def host_runtime_graph(path: Path, out: Path):
    """The describer under the host's onnxruntime, parsed as the host parses a container's output."""
    done = subprocess.run([sys.executable, str(containers_dir() / "harness" / "tiergate_describe.py"),
                           "--runtime", "onnxruntime", "--model", str(path), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    dc = resolve(X86)[0]
    graph = parse_describe(out, target=dc.name, tier=dc.tier, runtime=dc.runtime, emulated=False,
                           image="host", image_id="host", artifact_sha256="")
    return graph, done


def test_seed_pattern_is_harmless_on_onnxruntime(tmp_path):
    art = load_artifact(m.save(m.conv_net(batchnorm=True, identity=True), "seed.onnx", tmp_path))
    graph, done = host_runtime_graph(art.path, tmp_path / "d")
    assert done.returncode == 0 and graph.ok and graph.default_level == "all"
    assert graph.levels["basic"].ops.get(":BatchNormalization", 0) == 0   # folded into the Conv
    assert ":Identity" not in graph.levels["basic"].ops                    # removed
    assert graph.levels["extended"].ops["com.microsoft:FusedConv"] >= 1   # Conv + LeakyRelu fused
    file_rules = {f.rule for f in lint(art)}
    assert {"unfused-activation", "unfolded-batchnorm"} <= file_rules
    on_tier = lint(art, resolve(X86)[0], runtime=graph)
    assert not [f for f in on_tier if f.rule in ("unfused-activation", "unfolded-batchnorm")]


def _float_gemm_beside_qgemm() -> onnx.ModelProto:
    """x -> Q/DQ -> Gemm(w1) -> Q/DQ -> Relu -> Gemm(w2 in float: its weight has no DequantizeLinear)
    -> Q/DQ -> Gemm(w3) -> Q/DQ -> y: the first and last become QGemm, the middle one stays float."""
    rng = np.random.default_rng(0)
    w1 = rng.integers(-100, 100, (8, 8)).astype(np.int8)
    inits = [numpy_helper.from_array(w1, "w1_q"), numpy_helper.from_array(np.float32(0.01), "s_w"),
             numpy_helper.from_array(np.int8(0), "z_w"), numpy_helper.from_array(np.float32(0.02), "s_a"),
             numpy_helper.from_array(np.uint8(128), "z_a"),
             numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.integers(-100, 100, (8, 8)).astype(np.int8), "w3_q")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_a", "z_a"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s_a", "z_a"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1_q", "s_w", "z_w"], ["w1"]),
        helper.make_node("Gemm", ["xd", "w1"], ["h"], name="gemm_q"),
        helper.make_node("QuantizeLinear", ["h", "s_a", "z_a"], ["hq"]),
        helper.make_node("DequantizeLinear", ["hq", "s_a", "z_a"], ["hd"]),
        helper.make_node("Relu", ["hd"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2"], ["g"], name="gemm_float"),
        helper.make_node("QuantizeLinear", ["g", "s_a", "z_a"], ["gq"]),
        helper.make_node("DequantizeLinear", ["gq", "s_a", "z_a"], ["gd"]),
        helper.make_node("DequantizeLinear", ["w3_q", "s_w", "z_w"], ["w3"]),
        helper.make_node("Gemm", ["gd", "w3"], ["k"], name="gemm_q2"),
        helper.make_node("QuantizeLinear", ["k", "s_a", "z_a"], ["kq"]),
        helper.make_node("DequantizeLinear", ["kq", "s_a", "z_a"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "qgemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_float_gemm_beside_a_qgemm_is_a_runtime_float_island(tmp_path):
    art = load_artifact(m.save(_float_gemm_beside_qgemm(), "qgemm.onnx", tmp_path))
    graph, done = host_runtime_graph(art.path, tmp_path / "d")
    assert done.returncode == 0, done.stderr
    ops = graph.levels["all"].ops
    assert ops.get("com.microsoft:QGemm", 0) == 2 and ops.get(":Gemm", 0) == 1  # two fused, one left in float
    islands = [f for f in lint(art, resolve(X86)[0], runtime=graph) if f.rule == "float-island"]
    assert any("Gemm" in f.message and f.basis == "runtime" for f in islands), [f.message for f in islands]


def test_refused_model_gives_the_runtimes_message(tmp_path):
    art = load_artifact(m.save(m.unary_net("Det", TensorProto.DOUBLE), "det.onnx", tmp_path))
    graph, done = host_runtime_graph(art.path, tmp_path / "d")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert not graph.ok and "NOT_IMPLEMENTED" in graph.error
    (finding,) = [f for f in lint(art, resolve(X86)[0], runtime=graph) if f.severity == "error"]
    assert finding.rule == "unsupported-op" and finding.basis == "runtime" and graph.error in finding.message


def test_first_difference_names_the_level(tmp_path):
    base, _ = host_runtime_graph(m.save(m.conv_net(batchnorm=True), "a.onnx", tmp_path), tmp_path / "a")
    ident, _ = host_runtime_graph(m.save(m.conv_net(batchnorm=True, identity=True), "b.onnx", tmp_path), tmp_path / "b")
    alpha, _ = host_runtime_graph(m.save(m.conv_net(batchnorm=True, alpha=0.3), "c.onnx", tmp_path), tmp_path / "c")
    assert first_difference(base, ident) is None          # the Identity is gone from basic on
    assert first_difference(base, alpha) == "basic"
    assert level_differences(base, alpha)["basic"]["same"] == {"structure": False, "weights": True,
                                                               "quantization": True}


@pytest.mark.docker
@pytest.mark.slow
def test_runtime_intake_runs_once_per_tier_and_artifact(tmp_path, tiergate_home):
    from tiergate.build import ensure_runtime_image
    from tiergate.execution.describe import runtime_intake
    from tiergate.execution.engine import connect

    dc = resolve(X86)[0]
    art = load_artifact(m.save(m.conv_net(batchnorm=True, identity=True), "seed.onnx", tmp_path))
    client = connect()
    image = ensure_runtime_image(dc, client=client)
    graph, findings = runtime_intake(art, dc, image.tag, client=client)
    assert graph.ok and not graph.cached and graph.machine == "x86_64" and graph.image_id == image.image_id
    assert not [f for f in findings if f.rule in ("unfused-activation", "unfolded-batchnorm")]
    again, _ = runtime_intake(art, dc, image.tag, client=client)
    assert again.cached and again.fingerprints() == graph.fingerprints()
    assert len(list((tiergate_home / "runtime-graphs").iterdir())) == 1
