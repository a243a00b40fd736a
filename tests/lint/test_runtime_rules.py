"""The lint rules judged on the graph a tier's runtime runs (issue 24): tiny generated models,
described by the describer under the host's own onnxruntime (the pinned version the x86 image
carries) as the tiers' containers describe them. Each rule: the model it must flag on the runtime
graph, with the nodes named, and a clean twin."""

from __future__ import annotations

import onnx
import pytest

import modelkit as m
from lint.test_runtime_graph import X86, host_runtime_graph
from tiergate.artifact import load_artifact
from tiergate.lint import lint
from tiergate.targets import resolve


def _on_tier(path, tmp_path, rule, level=None):
    """`rule`'s findings on the x86 tier's runtime graph (at `level`: the tier's own level when None)."""
    art = load_artifact(path)
    graph, done = host_runtime_graph(art.path, tmp_path / f"d-{art.path.stem}")
    assert done.returncode == 0, done.stderr
    if level:
        graph.default_level = level
    return art, graph, [f for f in lint(art, resolve(X86)[0], runtime=graph) if f.rule == rule]


# ---------------------------------------------------------------- unfolded-batchnorm at runtime

@pytest.mark.parametrize("channels", [4, 16])
def test_batchnorm_kept_after_a_noop_clip_is_flagged_on_the_tier(tmp_path, channels):
    """Conv -> Clip(float range) -> BatchNormalization: onnxruntime fuses the Clip into the Conv, so the
    normalization is no longer folded. At level all on x86 NCHWc turns it into a depthwise 1x1 Conv."""
    path = m.save(m.conv_net(batchnorm=True, noop_clip=True, channels=channels), f"clip{channels}.onnx", tmp_path)
    art, graph, found = _on_tier(path, tmp_path, "unfolded-batchnorm")
    if not graph.levels["all"].ops.get("com.microsoft.nchwc:Conv"):
        pytest.skip("this CPU gives onnxruntime no NCHWc kernels (no AVX2): level all is level extended's graph")
    (f,) = found
    runs = graph.runtime_artifact
    assert graph.default_level == "all" and f.basis == "runtime" and f.target == X86 and X86 in f.message
    assert [runs.nodes[i].op for i in f.nodes] == ["Conv", "Conv"]        # NCHWc conv, then the BN's conv
    assert f.node_names == ("clipped_nchwc", "bn_bn_nchwc")               # onnxruntime's own names
    assert "depthwise 1x1 NCHWc Conv" in f.message and "fused Clip whose bounds no value reaches" in f.message
    # the BatchNormalization really runs: one more convolution than the clean twin
    twin = m.save(m.conv_net(batchnorm=True, channels=channels), f"twin{channels}.onnx", tmp_path)
    _, clean, none = _on_tier(twin, tmp_path, "unfolded-batchnorm")
    assert none == []
    conv = "com.microsoft.nchwc:Conv"
    assert graph.levels["all"].ops[conv] == clean.levels["all"].ops[conv] + 1


def test_batchnorm_after_a_fusedconv_at_the_extended_level(tmp_path):
    """The graph without NCHWc (level extended here; arm64's level all has no NCHWc either):
    FusedConv(activation Clip over the float range) -> BatchNormalization."""
    path = m.save(m.conv_net(batchnorm=True, noop_clip=True), "clip_ext.onnx", tmp_path)
    art, graph, (f,) = _on_tier(path, tmp_path, "unfolded-batchnorm", level="extended")
    runs = graph.levels["extended"].artifact
    assert [(runs.nodes[i].domain, runs.nodes[i].op) for i in f.nodes] == [("com.microsoft", "FusedConv"),
                                                                          ("", "BatchNormalization")]
    assert "level extended" in f.message and "FusedConv -> BatchNormalization x1" in f.message
    _, _, basic = _on_tier(path, tmp_path, "unfolded-batchnorm", level="basic")
    assert "Conv -> Clip -> BatchNormalization x1" in basic[0].message and "remove them" in basic[0].message


def test_a_real_activation_before_the_batchnorm_is_not_foldable(tmp_path):
    """Conv -> Relu -> BatchNormalization cannot be folded into the Conv: never flagged, on the file or the tier."""
    from onnx import helper

    model = m.conv_net(batchnorm=True, channels=16)
    nodes = list(model.graph.node)
    nodes.insert(1, helper.make_node("Relu", ["c1"], ["r1"], name="real_relu"))
    nodes[2].input[0] = "r1"
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    path = m.save(model, "relu_bn.onnx", tmp_path)
    assert [f for f in lint(load_artifact(path)) if f.rule == "unfolded-batchnorm"] == []
    _, graph, found = _on_tier(path, tmp_path, "unfolded-batchnorm")
    assert found == [] and graph.levels["all"].ops["com.microsoft.nchwc:Conv"] == 4  # the BN still runs


def test_noop_clip_is_seen_on_the_file_too():
    art = load_artifact(m.save(m.conv_net(batchnorm=True, noop_clip=True), "clip_file.onnx"))
    (f,) = [f for f in lint(art) if f.rule == "unfolded-batchnorm"]
    assert f.basis == "file" and f.node_names == ("conv1", "noop_clip", "bn1")
    # a Clip that clips (ReLU6) is an activation, not a no-op
    model = m.conv_net(batchnorm=True, noop_clip=True)
    for t in model.graph.initializer:
        if t.name in ("clip_lo", "clip_hi"):
            t.float_data[:] = []
            t.raw_data = (m.np.float32(0.0 if t.name == "clip_lo" else 6.0)).tobytes()
    relu6 = load_artifact(m.save(model, "clip_relu6.onnx"))
    assert [f for f in lint(relu6) if f.rule == "unfolded-batchnorm"] == []


@pytest.mark.parametrize("bound, noop", [(3.4e38, True), (1e30, True), (1e6, False)])
def test_a_clip_beyond_any_value_an_activation_reaches_is_a_no_op(bound, noop):
    """A Clip to +-3.4e38 (0.08 % inside float32's largest value: what an exporter slips after each Conv) or
    +-1e30 clips nothing a network computes; one at +-1e6 could (no range of the tensor says otherwise)."""
    art = load_artifact(m.save(m.conv_net(batchnorm=True, noop_clip=True, clip_bound=bound), f"clip{bound:g}.onnx"))
    found = [f for f in lint(art) if f.rule == "unfolded-batchnorm"]
    assert (found != []) is noop and (not found or found[0].node_names == ("conv1", "noop_clip", "bn1"))


def test_a_clip_beyond_its_tensor_s_quantization_range_is_a_no_op(tmp_path):
    """In a quantized model the file says what the clipped tensor can hold: a Clip at +-1e6 after a
    DequantizeLinear whose tensor is quantized over about [-3, 3] clips nothing; one at +-1 does."""
    import numpy as np

    from tiergate.artifact.graph import index_graph
    from tiergate.lint.finding import LintContext
    from tiergate.lint.rules.unfolded_batchnorm import _is_noop

    fp32 = m.save(m.conv_net(batchnorm=True), "clipq.onnx", tmp_path)
    x = {"x": np.random.default_rng(0).standard_normal((8, 3, 8, 8)).astype(np.float32)}
    m.quantize_qdq(fp32, tmp_path / "clipq-int8.onnx", x)

    def clipped(bound: float):
        model = onnx.load(tmp_path / "clipq-int8.onnx")
        bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
        source = bn.input[0]                              # c1's DequantizeLinear output
        model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(-bound, np.float32), "lo"),
                                        onnx.numpy_helper.from_array(np.array(bound, np.float32), "hi")])
        clip = onnx.helper.make_node("Clip", [source, "lo", "hi"], ["c1_clipped"], name="clip")
        bn.input[0] = "c1_clipped"
        model.graph.node.insert(list(model.graph.node).index(bn), clip)
        art = load_artifact(m.save(model, f"clipq-{bound:g}.onnx", tmp_path))
        return _is_noop(LintContext(art, None, index_graph(art)), next(n for n in art.nodes if n.op == "Clip"))

    assert clipped(1e6) and not clipped(1.0)


# ---------------------------------------------------------------- layout-reorder (x86's NCHWc)

def test_layout_reorders_around_every_conv(tmp_path):
    """4 channels (not a multiple of the NCHWc block): onnxruntime converts the layout back after every
    convolution. 16 channels: the three convolutions share one NCHWc region, one reorder on the way out."""
    _, clean, none = _on_tier(m.save(m.conv_net(channels=16), "c16.onnx", tmp_path), tmp_path, "layout-reorder")
    if not clean.levels["all"].ops.get("com.microsoft.nchwc:Conv"):
        pytest.skip("this CPU gives onnxruntime no NCHWc kernels (no AVX2): no blocked layout to judge")
    assert none == [] and clean.levels["all"].ops["com.microsoft.nchwc:ReorderOutput"] == 1
    art, graph, (f,) = _on_tier(m.save(m.conv_net(channels=4), "c4.onnx", tmp_path), tmp_path, "layout-reorder")
    runs = graph.runtime_artifact
    assert f.severity == "warning" and f.basis == "runtime" and f.target == X86
    assert [runs.nodes[i].op for i in f.nodes] == ["ReorderOutput"] * 3      # one after each of the 3 convolutions
    assert len(f.node_names) == 3 and all(name.startswith("ReorderOutput") for name in f.node_names)
    assert "3 NCHWc convolution(s) in 3 separate NCHWc regions (3 holding a single convolution)" in f.message
    # judged on the file (no runtime graph): nothing, a file has no reorders
    assert [x for x in lint(art, resolve(X86)[0]) if x.rule == "layout-reorder"] == []


def test_layout_reorder_names_the_op_without_an_nchwc_kernel(tmp_path):
    """Conv -> Clip(float range) -> BN -> LeakyRelu: the normalization's depthwise conv cannot take the LeakyRelu,
    which leaves NCHWc and comes back: one round trip, fewer reorders than convolutions (information)."""
    _, graph, found = _on_tier(m.save(m.conv_net(batchnorm=True, noop_clip=True, channels=16), "rt.onnx", tmp_path),
                               tmp_path, "layout-reorder")
    if not graph.levels["all"].ops.get("com.microsoft.nchwc:Conv"):
        pytest.skip("this CPU gives onnxruntime no NCHWc kernels (no AVX2): no blocked layout to judge")
    (f,) = found
    assert f.severity == "info" and "between the regions run ops without an NCHWc kernel here: LeakyRelu x1" in f.message
    assert sorted(graph.runtime_artifact.nodes[i].op for i in f.nodes) == ["ReorderInput", "ReorderOutput", "ReorderOutput"]


# ---------------------------------------------------------------- provider-fallback: the nodes named

def test_provider_fallback_names_the_nodes_of_the_graph_the_tier_runs(tmp_path):
    """The levels are onnxruntime's own (host describer); the placement is written as the describer writes it on a
    CUDA tier (no GPU here): two of the runtime graph's nodes left to the CPU are named, with their positions."""
    art = load_artifact(m.save(m.conv_net(channels=16), "gpu.onnx", tmp_path))
    graph, done = host_runtime_graph(art.path, tmp_path / "d")
    assert done.returncode == 0, done.stderr
    gpu = resolve("cuda-gpu-onnxruntime")[0]
    runs = graph.runtime_artifact
    graph.runtime, graph.target = "onnxruntime-gpu", gpu.name
    graph.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    left = {runs.nodes[0].name, runs.nodes[-1].name}
    graph.nodes = [[n.name, f"{n.domain}:{n.op}", "CPUExecutionProvider" if n.name in left else "CUDAExecutionProvider"]
                   for n in runs.nodes]
    (f,) = [f for f in lint(art, gpu, runtime=graph) if f.rule == "provider-fallback"]
    assert f.basis == "runtime" and f.target == gpu.name and "2 node(s) fall back" in f.message
    assert set(f.node_names) == left and [runs.nodes[i].name for i in f.nodes] == list(f.node_names)
    graph.nodes = [[n[0], n[1], "CUDAExecutionProvider"] for n in graph.nodes]
    assert [f for f in lint(art, gpu, runtime=graph) if f.rule == "provider-fallback"] == []


# ---------------------------------------------------------------- LiteRT: nodes left to the default kernels

@pytest.mark.tflite_extra
def test_litert_default_kernels_are_named_on_the_tier(tmp_path):
    """The describer under the host's LiteRT (the tier's pinned ai-edge-litert): ARG_MAX and the CAST after it are
    not taken by XNNPACK; each is a runtime finding naming the node. The all-CONV_2D twin: nothing."""
    import subprocess
    import sys

    from tiergate.paths import containers_dir
    from tiergate.runtime_graph import parse_describe

    m.require_tflite_extra()
    tier = resolve("x86_64-cpu-tflite")[0]

    def judged(kind):
        art = load_artifact(m.save_tflite(m.tflite_bytes(kind), f"{kind}.tflite", tmp_path))
        out = tmp_path / f"d-{kind}"
        done = subprocess.run([sys.executable, str(containers_dir() / "harness" / "tiergate_describe.py"),
                               "--runtime", "tflite", "--model", str(art.path), "--out", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        graph = parse_describe(out, target=tier.name, tier=tier.tier, runtime=tier.runtime, emulated=False,
                               image="host", image_id="host", artifact_sha256="")
        return art, graph, [f for f in lint(art, tier, runtime=graph) if f.rule == "unsupported-op"]

    art, graph, found = judged("argmax")
    assert graph.placement["default"] == 2
    assert sorted(art.nodes[f.nodes[0]].op for f in found) == ["ARG_MAX", "CAST"]
    assert all(f.basis == "runtime" and f.target == tier.name and f.severity == "warning"
               and "LiteRT's default CPU kernel" in f.message and len(f.node_names) == 1 for f in found)
    _, clean, none = judged("float")
    assert none == [] and set(clean.placement) == {"xnnpack"}


# ---------------------------------------------------------------- float-island in an INT8 region at runtime

def _with_float_sin(quantized):
    """The quantized conv_net with a float Sin (no integer kernel) after act1's DequantizeLinear, quantized again
    with act1's parameters before conv2: DQ -> Sin -> Q -> DQ -> conv2."""
    from onnx import helper

    model = onnx.load(quantized)
    nodes = list(model.graph.node)
    at = next(k for k, n in enumerate(nodes) if n.name == "conv2")
    fed = nodes[at].input[0]
    dq = next(n for n in nodes if n.output[0] == fed)
    scale, zero = dq.input[1], dq.input[2]
    nodes[at].input[0] = "sin_dq"
    nodes[at:at] = [helper.make_node("Sin", [fed], ["sin"], name="float_sin"),
                    helper.make_node("QuantizeLinear", ["sin", scale, zero], ["sin_q"], name="sin_q"),
                    helper.make_node("DequantizeLinear", ["sin_q", scale, zero], ["sin_dq"], name="sin_dq")]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def test_float_op_between_int8_convs_is_a_runtime_island(tmp_path):
    """A float Sin between two QLinearConv: onnxruntime has no integer kernel for it, so the tier runs it in float
    between integer kernels; the island names it. The fully quantized twin has no island at runtime."""
    path = m.save(_with_float_sin(m.quantized_path()), "sin_island.onnx", tmp_path)
    art, graph, (f,) = _on_tier(path, tmp_path, "float-island")
    runs = graph.runtime_artifact
    assert sum(n for op, n in graph.levels["all"].ops.items() if op.endswith("QLinearConv")) == 3
    assert f.basis == "runtime" and f.target == X86 and "between quantized regions" in f.message
    assert f.node_names == ("float_sin",) and runs.nodes[f.nodes[0]].op == "Sin"
    clean = m.save(onnx.load(m.quantized_path()), "int8.onnx", tmp_path)
    assert _on_tier(clean, tmp_path, "float-island")[2] == []


def test_a_float_conv_onnxruntime_quantizes_itself_is_no_island_at_runtime(tmp_path):
    """conv2 left in float by the quantizer (DQ -> Conv(float weights) -> Q): an island in the file, but
    onnxruntime 1.31 quantizes its weights and runs a QLinearConv (conv2_weight_q): none on the tier."""
    path = m.save(onnx.load(m.quantized_path(exclude_middle=True)), "island.onnx", tmp_path)
    assert [f for f in lint(load_artifact(path)) if f.rule == "float-island"] != []
    _, graph, found = _on_tier(path, tmp_path, "float-island")
    assert found == [] and graph.levels["all"].ops.get(":Conv", 0) == 0
