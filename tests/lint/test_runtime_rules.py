"""The lint rules judged on the graph a tier's runtime runs (issue 24): tiny generated models,
described by the describer under the host's own onnxruntime (the pinned version the x86 image
carries) as the tiers' containers describe them. Each rule: the model it must flag on the runtime
graph, with the nodes named, and a clean twin."""

from __future__ import annotations

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
    art, graph, (f,) = _on_tier(path, tmp_path, "unfolded-batchnorm")
    runs = graph.runtime_artifact
    assert graph.default_level == "all" and f.basis == "runtime" and f.target == X86 and X86 in f.message
    assert [runs.nodes[i].op for i in f.nodes] == ["Conv", "Conv"]        # NCHWc conv, then the BN's conv
    assert f.node_names == ("clipped_nchwc", "bn_bn_nchwc")               # onnxruntime's own names
    assert "depthwise 1x1 NCHWc Conv" in f.message and "fused Clip over the whole float range" in f.message
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
