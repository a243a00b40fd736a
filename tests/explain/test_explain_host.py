"""explain with the dump script run by this machine's onnxruntime (HostRunner): pairing, figures,
suggestions and bad input, in seconds. The same script runs inside each tier's container in
test_explain_tiers.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

import modelkit
import models
from tiergate.cli.main import main
from tiergate.execution.explain import HostRunner, explain
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"
ARM = "arm64-cpu-onnxruntime"


def _explain(candidate, paths, targets=X86, runner=None):
    return explain(candidate, paths["fp32"], paths["eval"], resolve(targets), runner=runner or HostRunner())


@pytest.mark.parametrize("defect", ["default_range", "relu_removed"])
def test_a_broken_tensor_is_located(tiergate_home, mlp_set, defect):
    item = _explain(mlp_set[defect], mlp_set).targets[X86]
    assert item.first_divergent == models.TENSOR
    names = [layer.tensor for layer in item.layers]
    assert names.index("h0") < names.index(models.TENSOR) < names.index("y")     # topological order
    before = names.index(models.TENSOR)
    assert all(layer.sqnr_db >= 20 for layer in item.layers[:before])
    assert item.layers[before].sqnr_db < 20 and item.end_to_end_sqnr_db < 20
    # suggestions name only nodes the candidate quantized: fc2 reads the badly ranged r through its DQ; with r's
    # Q/DQ removed fc2 reads float r (and relu1 is gone): keeping anything around r in float would change nothing
    assert ("fc2" in item.keep_float) is (defect == "default_range") and "relu1" not in item.keep_float


def test_the_default_range_gets_a_calibration_hint(tiergate_home, mlp_set):
    item = _explain(mlp_set["default_range"], mlp_set).targets[X86]
    hint = next(h for h in item.calibration if h.startswith(f"calibration range of {models.TENSOR} "))
    assert "[-6.024, 5.976]" in hint and "observed [0," in hint
    layer = next(x for x in item.layers if x.tensor == models.TENSOR)
    assert layer.range == [-6.02353, 5.97647] and layer.saturation > 0


def test_a_well_calibrated_int8_has_no_divergent_layer(tiergate_home, mlp_set):
    item = _explain(mlp_set["int8"], mlp_set).targets[X86]
    assert item.first_divergent is None and item.keep_float == []
    assert all(layer.sqnr_db >= 20 for layer in item.layers)


def test_json_shape(tiergate_home, mlp_set):
    doc = _explain(mlp_set["relu_removed"], mlp_set).to_json()
    item = doc["targets"][X86]
    assert item["first_divergent"] == models.TENSOR
    for layer in item["layers"]:
        assert {"tensor", "op", "sqnr_db", "cosine", "saturation", "max_abs_error"} <= set(layer)
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc


class TierFault(HostRunner):
    """The host's dump, with one tier's integer tensor saturated the way an int16 accumulator clips
    (x86's u8s8 kernels without VNNI): a stand-in for a kernel this host does not have.

    A real tier-specific divergence was looked for and not found on this machine (x86_64 with
    AVX512-VNNI, onnxruntime 1.31.1 native vs aarch64 under QEMU 10): this file's MLP with gain 40
    (activations and weights near their ends), quantized per-tensor with reduce_range=False as
    QDQ and QOperator, each with S8S8 (ActivationSymmetric, WeightSymmetric) and U8S8 activations,
    and dynamically (MatMulInteger, int8 and uint8 weights): every layer's SQNR agreed between the
    two tiers within 0.1 dB (no saturation: VNNI's u8s8 dot product accumulates in int32 without
    the int16 pair sums of the pre-VNNI kernels). A machine without VNNI may show it for real."""

    def __init__(self, tier: str, tensor: str):
        self.tier, self.tensor = tier, tensor

    def identity(self, dc):
        return f"{super().identity(dc)}-{dc.name}-fault-{self.tier == dc.name}"

    def run(self, dc, models_, data, samples, out):
        super().run(dc, models_, data, samples, out)
        if dc.name != self.tier:
            return
        doc = json.loads((out / "explain.json").read_text())
        keys = {v: k for k, v in doc["models"]["candidate"]["tensors"].items()}
        path = out / f"candidate.{keys[self.tensor]}.npy"
        array = np.load(path)
        np.save(path, np.clip(array, 0, 40).astype(array.dtype))    # uint8 codes above 40 clip


def test_a_tier_specific_divergence_is_located_on_that_tier_only(tiergate_home, mlp_set):
    result = _explain(mlp_set["int8"], mlp_set, f"{X86},{ARM}", TierFault(X86, "r_QuantizeLinear_Output"))
    assert result.targets[X86].first_divergent == models.TENSOR
    assert result.targets[ARM].first_divergent is None
    assert any(f"{X86}: first divergent layer {models.TENSOR}" in r for r in result.reasons())


def test_no_tensor_in_common_is_one_line_exit_2(tiergate_home, mlp_set, tmp_path, capsys):
    import onnx

    other = modelkit.renamed(models.fp32_mlp(seed=3))
    other.graph.output[0].name = "z"
    for node in other.graph.node:
        node.output[:] = ["z" if n == "y" else n for n in node.output]
    path = modelkit.write(other, tmp_path / "other.onnx")
    onnx.checker.check_model(onnx.load(path))
    code = main(["explain", "-c", str(mlp_set["int8"]), "-r", str(path), "-d", str(mlp_set["eval"]), "-t", X86])
    err = capsys.readouterr().err
    assert code == 2 and "no tensor in common" in err and "Traceback" not in err


def test_subgraph_tensors_are_listed_as_skipped(tiergate_home, tmp_path):
    model = modelkit.if_subgraph()
    ref = modelkit.write(model, tmp_path / "ref.onnx")
    cand = modelkit.write(model, tmp_path / "cand.onnx")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32))
    item = explain(cand, ref, tmp_path / "d.npz", resolve(X86), runner=HostRunner()).targets[X86]
    assert item.skipped == ["else_y", "then_y"] and item.branches == []
    # the If's condition is computed from x, which differs between samples: not specialized, and said why
    assert item.skipped_reasons["then_y"] == "inside y (If): its condition depends on x, whose values differ between samples"
    assert [layer.tensor for layer in item.layers][-1] == "y" and item.first_divergent is None


def test_mixed_precision_needs_calibration_data(tiergate_home, mlp_set, tmp_path, capsys):
    code = main(["explain", "-c", str(mlp_set["int8"]), "-r", str(mlp_set["fp32"]), "-d", str(mlp_set["eval"]),
                 "-t", X86, "--mixed-precision", str(tmp_path / "m.onnx")])
    assert code == 2 and "--calibration-data" in capsys.readouterr().err


def test_html_marks_the_first_divergent_layer(tiergate_home, mlp_set, tmp_path):
    from tiergate.reports.explain_html import render_html

    html = render_html(_explain(mlp_set["default_range"], mlp_set))
    assert "<svg" in html and "first divergent on x86_64-cpu-onnxruntime" in html
    assert "<tr class='first'><td class='l'>r</td>" in html


def test_a_softmax_one_against_the_int8_top_is_rounding_not_saturation():
    """A probability of 1.0 against int8's top (255/256 with zero point -128) is one step off: not clipped;
    values well beyond the range are."""
    import numpy as np

    from tiergate.explain import Source, measure

    source = Source("probs", "probs_q", "Softmax", 3, scale=1 / 256, zero_point=-128, dtype="int8")
    ref = np.array([[1.0, 0.0], [0.5, 0.5]], dtype=np.float32)
    cand = np.array([[127, -128], [0, 0]], dtype=np.int8)
    assert measure(source, cand, ref).saturation == 0.0
    clipped = np.array([[3.0, 0.0], [0.5, 0.5]], dtype=np.float32)
    assert measure(source, cand, clipped).saturation == 0.25
