"""The graph rules on a compiled tier's lowered graph (tiergate.lint.kernels): the kernels a TVM compile records,
written here as the compile writes them (containers/tvm/tiergate_tvm_compile.py, kernel_graph) for the generated
conv net; the real compile's records are checked in tests/tvm/test_tvm_lint.py."""

from __future__ import annotations

import modelkit as m
from tiergate.artifact import load_artifact
from tiergate.lint import lint
from tiergate.lint.kernels import kernel_artifact, precision
from tiergate.runtime_graph import from_describe
from tiergate.targets import resolve

TVM = "x86_64-cpu-tvm"
F = "float32"


def _kernel(name, ops, inputs, dtype=F):
    return {"name": name, "kernel": "_".join(op[0] for op in ops), "ops": ops, "inputs": inputs, "dtype": dtype}


def _graph(kernels, after="FuseOps", disabled=()):
    record = {"tvm_version": "0.27.0.post1", "passes": [{"name": "FuseOps", "fingerprint": "0" * 16}],
              "kernels": kernels, "kernels_after": after, "disabled_passes": list(disabled)}
    doc = {"ok": True, "runtime": "tvm", "machine": "x86_64", "tvm": record, "disabled": list(disabled)}
    return from_describe(doc, None, target=TVM, tier="x86_64-cpu", runtime="tvm", emulated=False, image="",
                         image_id="", artifact_sha256="")


CONV = ["conv2d", 4, [F, F]]
BN = ["batch_norm", 2, [F, F, F, F, F]]
LEAKY = ["leaky_relu", 0, [F]]
RELU = ["relu", 0, [F]]
FUSED = [_kernel("lv", [CONV], ["x", ""]), _kernel("lv1", [BN, LEAKY], ["lv", "", "", "", ""]),
         _kernel("lv2", [CONV, ["add", 1, [F, F]], RELU], ["lv1", ""]), _kernel("gv", [CONV], ["lv2", ""])]
APART = [_kernel("lv", [CONV], ["x", ""]), _kernel("lv1", [BN], ["lv", "", "", "", ""], ""),
         _kernel("lv3", [LEAKY], ["lv1"]), _kernel("lv4", [CONV], ["lv3", ""]), _kernel("lv5", [RELU], ["lv4"]),
         _kernel("gv", [CONV], ["lv5", ""])]


def _findings(path, graph, rule):
    return [f for f in lint(load_artifact(path), resolve(TVM)[0], runtime=graph) if f.rule == rule]


def test_an_identity_the_frontend_dropped_is_no_finding_and_the_batchnorm_split_is(tmp_path):
    path = m.save(m.conv_net(identity=True, batchnorm=True), "ident.onnx", tmp_path)
    on_file = [f for f in lint(load_artifact(path)) if f.rule == "unfused-activation"]
    assert on_file and "Identity" in on_file[0].message          # the file has it...
    graph = _graph(FUSED)
    assert _findings(path, graph, "unfused-activation") == []    # ...TVM runs batch_norm+leaky_relu in one kernel
    (bn,) = _findings(path, graph, "unfolded-batchnorm")
    assert bn.basis == "runtime" and bn.target == TVM and "lowered graph after FuseOps" in bn.message
    assert "conv2d -> batch_norm+leaky_relu" in bn.message and bn.nodes == (0, 1)
    assert bn.node_names == ("lv", "lv1")


def test_fuseops_off_leaves_every_activation_in_a_kernel_of_its_own(tmp_path):
    path = m.save(m.conv_net(batchnorm=True), "bn.onnx", tmp_path)
    found = _findings(path, _graph(APART, after="FoldConstant", disabled=["FuseOps"]), "unfused-activation")
    assert [f.nodes for f in found] == [(1, 2), (3, 4)]
    assert "leaky_relu runs in a kernel apart from batch_norm" in found[0].message
    assert "relu runs in a kernel apart from conv2d" in found[1].message
    assert all("FuseOps is switched off" in f.message for f in found)
    assert _findings(path, _graph(APART, after="FoldConstant"), "unfused-activation")[0].message.endswith(
        "FuseOps did not run")


def test_an_injective_operator_first_is_why_fuseops_stopped(tmp_path):
    path = m.save(m.conv_net(), "plain.onnx", tmp_path)
    kernels = [_kernel("lv", [CONV], ["x", ""]), _kernel("lv1", [["transpose", 2, [F]], RELU], ["lv"]),
               _kernel("gv", [CONV], ["lv1", ""])]
    (f,) = _findings(path, _graph(kernels), "unfused-activation")
    assert "transpose (injective) comes first" in f.message and "into a conv2d kernel" in f.message
    # an activation after its producer in one kernel, or no activation at all: nothing
    assert _findings(path, _graph(FUSED), "unfused-activation") == []


def test_a_quantized_model_computed_wholly_in_float_is_one_finding(tmp_path):
    path = m.quantized_path()
    q = ["quantize", 0, [F]]
    dq = ["dequantize", 0, ["int8"]]
    kernels = [_kernel("lv", [q, dq], ["x"]), _kernel("lv1", [CONV, q, dq], ["lv", ""]),
               _kernel("gv", [BN, q, dq, LEAKY, q, dq], ["lv1", "", "", "", ""])]
    graph = _graph(kernels)
    assert precision(kernel_artifact(graph, load_artifact(path))) == ["neutral", "float", "neutral"]
    (f,) = _findings(path, graph, "float-island")
    assert "computes in float on this tier: all 1 compute kernel(s) (conv2d) read float data" in f.message
    assert "fake quantization" in f.message and f.nodes == (1,)
    # the FP32 model: nothing to say
    fp32 = m.save(m.conv_net(batchnorm=True), "fp32.onnx", tmp_path)
    assert _findings(fp32, graph, "float-island") == []


def test_a_float_kernel_between_integer_kernels_is_an_island(tmp_path):
    path = m.quantized_path()
    i8 = "int8"
    kernels = [_kernel("lv", [["conv2d", 4, [i8, i8]]], ["x", ""], "int32"),
               _kernel("lv1", [["dequantize", 0, ["int32"]]], ["lv"]),
               _kernel("lv2", [["matmul", 4, [F, F]]], ["lv1", ""]),
               _kernel("lv3", [["quantize", 0, [F]]], ["lv2"], i8),
               _kernel("gv", [["conv2d", 4, [i8, i8]]], ["lv3", ""], "int32")]
    (f,) = _findings(path, _graph(kernels), "float-island")
    assert f.nodes == (2,) and "matmul" in f.message and "between quantized regions" in f.message


def test_no_kernels_recorded_falls_back_to_the_file(tmp_path):
    path = m.save(m.conv_net(identity=True, batchnorm=True), "ident.onnx", tmp_path)
    (f,) = _findings(path, _graph([]), "unfused-activation")
    assert f.basis == "file" and "Identity" in f.message
