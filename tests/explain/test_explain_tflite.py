"""explain on TFLite pairs made by the TFLite converter: an FP32 dense net and its full-INT8 twin keep the
converter's tensor names, so their tensors pair by name (the interpreter runs with
experimental_preserve_all_tensors). One layer broken (its output range shrunk 8x, so the kernel clips
it) is located at that tensor; a pair whose names do not match says what could not be paired."""

from __future__ import annotations


import numpy as np
import pytest

import modelkit
from rich.console import Console

from tiergate.cli.explain import print_explanation
from tiergate.explain import markdown_table
from tiergate.execution.explain import HostRunner, explain
from tiergate.orchestrator.explain_ab import docker_runner
from tiergate.targets import resolve

X86 = "x86_64-cpu-tflite"
ARM = "arm64-cpu-tflite"
BROKEN = "MatMul;Relu"          # the converter's name of the first dense layer's output (relu fused)

pytestmark = pytest.mark.tflite_extra


@pytest.fixture(scope="module")
def tfl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explain-tflite")
    paths = modelkit.tflite_mlp_pair(folder)
    model = modelkit._unpack(paths["int8"].read_bytes())
    hit = [t for t in model.subgraphs[0].tensors if t.name == BROKEN.encode()]
    assert len(hit) == 1 and hit[0].quantization.scale is not None
    hit[0].quantization.scale = [hit[0].quantization.scale[0] / 8]      # the layer's range, too narrow
    paths["broken"] = modelkit.save_tflite(modelkit._pack(model), "net_broken.tflite", folder)
    np.savez(folder / "eval.npz", x=np.random.default_rng(5).standard_normal((24, 8)).astype(np.float32))
    paths["eval"] = folder / "eval.npz"
    return paths


def _check_paired(item, machine=None):
    names = [layer.tensor for layer in item.layers]
    assert names == ["x", BROKEN, "MatMul_11", "Identity"], names         # every op output, in op order
    assert item.unpaired == [] and item.error == ""
    if machine:
        assert item.machine == machine


def test_a_well_converted_int8_pairs_every_tensor_and_none_diverges(tiergate_home, tfl):
    item = explain(tfl["int8"], tfl["fp32"], tfl["eval"], resolve(X86), runner=HostRunner()).targets[X86]
    _check_paired(item)
    assert item.first_divergent is None, [(x.tensor, x.sqnr_db) for x in item.layers]


def test_a_broken_layer_is_located_at_its_tensor(tiergate_home, tfl):
    item = explain(tfl["broken"], tfl["fp32"], tfl["eval"], resolve(X86), runner=HostRunner()).targets[X86]
    _check_paired(item)
    assert item.first_divergent == BROKEN
    layer = item.layers[1]
    assert item.layers[0].sqnr_db >= 20 > layer.sqnr_db and layer.saturation > 0.1
    assert BROKEN in item.keep_float
    assert any(h.startswith(f"calibration range of {BROKEN} ") and "clipped" in h for h in item.calibration)


def test_names_that_do_not_match_say_what_was_not_paired(tiergate_home, tfl, tmp_path):
    """A candidate whose hidden tensors were renamed (another converter, another naming): only the input
    and the output keep their names; the rest is listed as not paired, never matched by position."""
    model = modelkit._unpack(tfl["int8"].read_bytes())
    for tensor in model.subgraphs[0].tensors:
        if tensor.name in (BROKEN.encode(), b"MatMul_11"):
            tensor.name = b"renamed/" + tensor.name
    renamed = modelkit.save_tflite(modelkit._pack(model), "net_renamed.tflite", tmp_path)
    result = explain(renamed, tfl["fp32"], tfl["eval"], resolve(X86), runner=HostRunner())
    item = result.targets[X86]
    assert [layer.tensor for layer in item.layers] == ["x", "Identity"]
    assert item.unpaired == ["renamed/MatMul;Relu", "renamed/MatMul_11"]
    console = Console(record=True, width=200)
    print_explanation(console, result)
    for text in (console.export_text(), markdown_table(result)):
        assert "cannot be paired" in text and "renamed/MatMul;Relu" in text and "renamed/MatMul_11" in text


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_located_in_the_tiers_containers(tiergate_home, tfl):
    result = explain(tfl["broken"], tfl["fp32"], tfl["eval"], resolve(f"{X86},{ARM}"), runner=docker_runner(), samples=8)
    for name, machine in ((X86, "x86_64"), (ARM, "aarch64")):
        item = result.targets[name]
        _check_paired(item, machine)
        assert item.first_divergent == BROKEN, (name, [(x.tensor, x.sqnr_db) for x in item.layers])
