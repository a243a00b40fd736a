"""The pairing's defects located inside the tiers' containers (real Docker, real onnxruntime, real QEMU for arm64): a
representative subset of test_explain_pairing.py's models (QDQ per-channel and pre-processed, QOperator per-tensor),
both defects, 8 samples each."""

from __future__ import annotations

import pytest

import pairing_models as pm
from tiergate.execution.explain import explain
from tiergate.orchestrator.explain_ab import docker_runner
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"
ARM = "arm64-cpu-onnxruntime"
SUBSET = [("cnn", "QDQ", True, True), ("mlp", "QOperator", False, False)]
_MADE: dict = {}


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.parametrize("defect", ["default_range", "qdq_removed"])
@pytest.mark.parametrize("variant", SUBSET, ids=pm.variant_id)
def test_located_at_that_tensor_on_x86_and_emulated_arm64(tiergate_home, tmp_path_factory, variant, defect):
    if variant not in _MADE:
        _MADE[variant] = pm.write_variant(tmp_path_factory.mktemp("pairing-tiers"), variant)
    paths = _MADE[variant]
    result = explain(paths[defect], paths["fp32"], paths["eval"], resolve(f"{X86},{ARM}"), runner=docker_runner(),
                     samples=8)
    for name, machine in ((X86, "x86_64"), (ARM, "aarch64")):
        item = result.targets[name]
        assert item.error == "" and item.machine == machine
        assert item.first_divergent == pm.TENSOR[variant[0]], (name, [(x.tensor, x.sqnr_db) for x in item.layers])
