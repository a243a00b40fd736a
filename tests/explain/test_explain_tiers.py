"""explain inside the tiers' containers (real Docker, real onnxruntime, real QEMU for arm64), and the
mixed-precision candidate (--fix's float set alone) gated by the orchestrator on a real tier."""

from __future__ import annotations

import pytest

import models
from tiergate.cli.main import main
from tiergate.execution.explain import explain
from tiergate.orchestrator.explain_ab import docker_runner
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"
ARM = "arm64-cpu-onnxruntime"


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("defect", ["default_range", "relu_removed"])
def test_located_at_that_tensor_on_x86_and_emulated_arm64(tiergate_home, mlp_set, defect):
    result = explain(mlp_set[defect], mlp_set["fp32"], mlp_set["eval"], resolve(f"{X86},{ARM}"),
                     runner=docker_runner(), samples=16)
    for name, machine in ((X86, "x86_64"), (ARM, "aarch64")):
        item = result.targets[name]
        assert item.error == "" and item.machine == machine
        assert item.first_divergent == models.TENSOR, (name, [(x.tensor, x.sqnr_db) for x in item.layers])


@pytest.mark.docker
@pytest.mark.slow
def test_mixed_precision_passes_where_int8_fails(tiergate_home, mlp_set, tmp_path, capsys):
    out = tmp_path / "mixed.onnx"
    code = main(["explain", "-c", str(mlp_set["default_range"]), "-r", str(mlp_set["fp32"]), "-d",
                 str(mlp_set["eval"]), "-t", X86, "--mixed-precision", str(out),
                 "--calibration-data", str(mlp_set["cal"]), "--json", "--out", str(tmp_path / "report"),
                 "--policy", str(mlp_set["policy"])])
    import json

    doc = json.loads(capsys.readouterr().out)
    mixed = doc["mixed_precision"]
    assert mixed["int8"]["verdict"] == "REJECT" and not mixed["int8"]["passes_against_reference"]
    assert mixed["mixed"]["passes_against_reference"], mixed["mixed"]["reasons"]
    # the A/B against the INT8 candidate is reported, whatever it says (on a model this tiny the float
    # layers' latency cost can exceed the A/B's 10% regression limit: that is the cost, reported)
    assert {f"{X86}/noninferior_accuracy", f"{X86}/noninferior_latency"} <= set(mixed["mixed"]["ab"])
    assert code == (0 if mixed["mixed"]["verdict"] == "PROMOTE" else 1)
    # the float set: the defect's Q/DQ pair (the Add that writes r and the MatMul that reads it, with the Relu that
    # quantization absorbed), found in one gate
    assert out.is_file() and mixed["gates"] == 1
    assert {"add1", "fc2"} <= set(mixed["mixed"]["excluded"]) <= {"add1", "relu1", "fc2"}
    assert mixed["trail"] == [{"layers": 1, "tensors": [models.TENSOR], "passed": True}]
    assert mixed["settings"] == {"format": "QDQ", "activation_type": "uint8", "weight_type": "int8",
                                 "per_channel": False, "reduce_range": False, "pre_process": False,
                                 "opset": 17, "weights": "offline", "activation_symmetric": False,
                                 "weight_symmetric": None, "float_op_types": [], "float_nodes": [],
                                 "op_types": ["Add", "MatMul", "Relu"]}
    assert mixed["int8"]["latency_ms"][X86] > 0 and mixed["mixed"]["size_bytes"] > 0
    assert doc["targets"][X86]["first_divergent"] == models.TENSOR
    assert (tmp_path / "report" / "explain.html").is_file()


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_gate_explain_names_the_first_divergent_layer_per_tier_on_reject_only(tiergate_home, mlp_set, capsys):
    import json

    def gate(candidate, *extra):
        code = main(["gate", "-c", str(mlp_set[candidate]), "-r", str(mlp_set["fp32"]), "-d", str(mlp_set["eval"]),
                     "-t", f"{X86},{ARM}", "--explain", "--policy", str(mlp_set["policy"]), *extra])
        return code, capsys.readouterr().out

    code, out = gate("default_range", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "REJECT"
    for name, machine in ((X86, "x86_64"), (ARM, "aarch64")):
        assert any(r.startswith(f"explain: {name}: first divergent layer {models.TENSOR} (") for r in doc["reasons"])
        assert doc["explain"]["targets"][name]["first_divergent"] == models.TENSOR
        assert doc["explain"]["targets"][name]["machine"] == machine
    code, out = gate("default_range")                     # the text view says the same (all from the caches)
    assert code == 1 and f"reason: explain: {ARM}: first divergent layer {models.TENSOR}" in " ".join(out.split())

    code, out = gate("int8", "--json")                    # PROMOTE: nothing is added
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "PROMOTE", doc["reasons"]
    assert "explain" not in doc and not any(r.startswith("explain:") for r in doc["reasons"])
    code, out = gate("int8")
    assert code == 0 and "explain" not in out and "first divergent" not in out
