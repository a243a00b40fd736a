"""provider-fallback reads the provider placement the tier's runtime made in its container.

No GPU is lent here, so the placement is written as the describer writes it on a CUDA tier
(`get_provider_graph_assignment_info`'s node -> provider list); the rule's judgement is under test.
"""

from __future__ import annotations

import modelkit as mk
from tiergate.artifact import load_artifact
from tiergate.lint import lint
from tiergate.runtime_graph import RuntimeGraph
from tiergate.targets import resolve

GPU = "cuda-gpu-onnxruntime"


def _graph(providers, nodes, ok=True, runtime="onnxruntime-gpu"):
    return RuntimeGraph(target=GPU, tier="gpu-server", runtime=runtime, machine="x86_64", emulated=False,
                        image="tiergate/runtime:x", image_id="sha256:x", artifact_sha256="a" * 64, ok=ok,
                        providers=providers, nodes=nodes)


def _fallback(tmp_path, graph):
    artifact = load_artifact(mk.save(mk.mlp(), "mlp.onnx", tmp_path))
    return [f for f in lint(artifact, resolve([GPU])[0], runtime=graph) if f.rule == "provider-fallback"]


def test_nodes_left_to_the_cpu_are_named_with_the_tier(tmp_path):
    graph = _graph(["CUDAExecutionProvider", "CPUExecutionProvider"],
                   [["MatMul_0", "MatMul", "CUDAExecutionProvider"], ["TopK_1", "TopK", "CPUExecutionProvider"],
                    ["TopK_2", "TopK", "CPUExecutionProvider"], ["Relu_3", "Relu", "CUDAExecutionProvider"]])
    (finding,) = _fallback(tmp_path, graph)
    assert finding.severity == "warning" and finding.basis == "runtime" and finding.target == GPU
    assert "2 node(s) fall back from CUDAExecutionProvider to the CPU" in finding.message and "TopK x2" in finding.message


def test_a_runtime_without_cuda_is_one_finding_and_full_placement_none(tmp_path):
    (finding,) = _fallback(tmp_path, _graph(["CPUExecutionProvider"], [["MatMul_0", "MatMul", "CPUExecutionProvider"]]))
    assert "CUDAExecutionProvider is not available" in finding.message and "every node runs on the CPU" in finding.message
    assert _fallback(tmp_path, _graph(["CUDAExecutionProvider", "CPUExecutionProvider"],
                                      [["MatMul_0", "MatMul", "CUDAExecutionProvider"]])) == []


def test_cpu_runtimes_and_refused_models_are_not_judged(tmp_path):
    assert _fallback(tmp_path, _graph(["CPUExecutionProvider"], [["m", "MatMul", "CPUExecutionProvider"]],
                                      runtime="onnxruntime")) == []
    assert _fallback(tmp_path, _graph([], [], ok=False)) == []
    artifact = load_artifact(mk.save(mk.mlp(), "mlp.onnx", tmp_path))
    assert [f for f in lint(artifact, resolve([GPU])[0]) if f.rule == "provider-fallback"] == []
