"""explain on TFLite models made by TensorFlow's converter (tests/explain/tflite_models.py): an FP32 CNN as the
reference; full-integer INT8, a layer made float by the converter's selective quantization, and dynamic-range
candidates, each with every tensor renamed (the converter keeps its names across precisions: renaming proves
the pairing does not lean on them). Defects sit in the middle of the network, at conv2 (MIDDLE):

- INT8: conv2's output given the default range [-6, 6] (its values reach about 15: clipped);
- conv2 made float (DEQUANTIZE -> CONV_2D float -> QUANTIZE, the converter's own float island) with the
  QUANTIZE the converter inserts after it given the default range. Removing a layer's quantization is not
  an error of its own in TFLite (it keeps every RELU as an op or a fused activation, unlike onnxruntime's
  QDQ, which absorbs a Relu into the output's range): a layer made float loses only what its
  re-quantization loses, so that is the defect made here;
- dynamic range (float activations, int8 weights, no activation range to get wrong): conv2's int8 weights
  read with a quarter of their scale.

The HostRunner tests run the dump script with this Python's ai-edge-litert; one lean test runs two defects
in the x86_64 and emulated arm64 TFLite tiers' containers."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

import tflite_models as tm
from tiergate.cli.explain import print_explanation
from tiergate.errors import InputError
from tiergate.execution.explain import HostRunner, explain
from tiergate.explain import Explanation, markdown_table, plan
from tiergate.orchestrator.explain_ab import docker_runner
from tiergate.targets import resolve

X86 = "x86_64-cpu-tflite"
ARM = "arm64-cpu-tflite"

pytestmark = pytest.mark.tflite_extra


@pytest.fixture(scope="module")
def tfl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explain-tflite")
    fp32 = tm.tflite("fp32")
    middle = tm.middle_name(fp32)
    island = tm.tflite("island")
    made = {
        "fp32": fp32,
        "int8": tm.renamed(tm.tflite("int8")),
        "int8_default_range": tm.renamed(tm.with_range(tm.tflite("int8"), middle)),
        "island": tm.renamed(island),
        "island_default_range": tm.renamed(tm.with_range(island, tm.quantize_output(island, middle))),
        "dynamic": tm.renamed(tm.tflite("dynamic")),
        "dynamic_weights": tm.renamed(tm.with_weight_scale(tm.tflite("dynamic"), middle, 0.25)),
        "unfused": tm.renamed(tm.unfused(fp32, middle)),
        "per_channel": tm.renamed(tm.per_channel(tm.tflite("int8"), middle)),
    }
    paths = {name: tm.write(folder, f"{name}.tflite", data) for name, data in made.items()}
    np.savez(folder / "eval.npz", image=tm.images(16, seed=5))
    paths["eval"] = folder / "eval.npz"
    paths["middle"] = middle
    paths["layers"] = ["image"] + [op.outputs[0] for op in _graph(paths["fp32"]).ops]
    return paths


def _graph(path):
    from tiergate.explain.tflite_pairing import read_graph

    return read_graph(path)


def _run(tfl, kind, samples=8):
    return explain(tfl[kind], tfl["fp32"], tfl["eval"], resolve(X86), runner=HostRunner(), samples=samples)


def _table(item):
    return [(x.tensor, x.candidate_tensor, round(x.sqnr_db, 1)) for x in item.layers]


def _check_paired(item, tfl):
    """Every layer of the reference paired, from a candidate tensor of another name, in the reference's order."""
    assert [x.tensor for x in item.layers] == tfl["layers"], _table(item)
    assert all(x.candidate_tensor.startswith("t") for x in item.layers[1:]), _table(item)
    assert item.unpaired == [] and item.error == ""


@pytest.mark.parametrize("kind", ["int8", "island", "dynamic"])
def test_a_clean_candidate_named_otherwise_pairs_every_layer_and_none_diverges(tiergate_home, tfl, kind):
    item = _run(tfl, kind).targets[X86]
    _check_paired(item, tfl)
    assert item.first_divergent is None, _table(item)
    assert all(x.sqnr_db > 25 for x in item.layers), _table(item)


def test_pairs_are_found_by_structure_through_the_tensors_the_converter_inserts(tfl):
    """The float island's CONV_2D output and the QUANTIZE after it both hold conv2's value; the INT8 model's
    quantized input holds the image; a dynamic-range model's float tensors pair one to one."""
    island = plan(tfl["island"], tfl["fp32"], tfl["eval"].parent / "work")
    at_middle = {s.candidate_op: s for s in island.sources if s.fp32 == tfl["middle"]}
    assert set(at_middle) == {"CONV_2D", "QUANTIZE"}
    assert at_middle["CONV_2D"].scale is None and at_middle["QUANTIZE"].scale > 0
    assert {s.candidate_op for s in island.sources if s.fp32 == "image"} == {"input", "QUANTIZE"}
    int8 = plan(tfl["int8"], tfl["fp32"], tfl["eval"].parent / "work")
    (image,) = [s for s in int8.sources if s.fp32 == "image"]
    assert image.tensor == "image" and image.dtype == "int8"      # a full-integer model reads int8
    assert int8.unpaired == [] and island.unpaired == []


@pytest.mark.parametrize("kind", ["int8_default_range", "island_default_range", "dynamic_weights"])
def test_a_defect_in_the_middle_is_located_at_that_layer(tiergate_home, tfl, kind):
    item = _run(tfl, kind).targets[X86]
    _check_paired(item, tfl)
    assert item.first_divergent == tfl["middle"], _table(item)
    k = tfl["layers"].index(tfl["middle"])
    assert all(x.sqnr_db > 25 for x in item.layers[:k]), _table(item)
    layer = item.layers[k]
    assert layer.sqnr_db < 20
    # the candidate's own names, and where the op came from: the line of conv2 in tflite_models._function
    # (an INT8 file keeps no debug metadata: the reference's op stands in)
    assert layer.candidate_tensor not in tfl["layers"]
    assert any(f"tflite_models.py:{tm.MIDDLE_LINE}" in where and where.startswith("Conv2D_1 (Conv2D)")
               for where in layer.location), layer.location
    if kind != "dynamic_weights":
        assert layer.saturation > 0.05 and layer.range == [-6.02353, 5.97647]
        assert layer.candidate_tensor in item.keep_float
        assert any(h.startswith(f"calibration range of {tfl['middle']} ") and "clipped" in h for h in item.calibration)


def test_island_defect_is_read_at_the_quantize_the_converter_inserted(tiergate_home, tfl):
    item = _run(tfl, "island_default_range").targets[X86]
    layer = next(x for x in item.layers if x.tensor == tfl["middle"])
    (quantize,) = [s for s in plan(tfl["island_default_range"], tfl["fp32"], tfl["eval"].parent / "w").sources
                   if s.fp32 == tfl["middle"] and s.candidate_op == "QUANTIZE"]
    assert layer.candidate_tensor == quantize.tensor          # the worse of the two tensors holding conv2's value


def test_what_stays_unpaired_says_why(tiergate_home, tfl, tmp_path):
    """A candidate that runs conv2's RELU as its own op (the reference fuses it): the value before the RELU is
    never held by the reference; the RELU's output pairs with conv2's. A per-channel quantized activation is
    not dequantized. Both reasons travel in the JSON and the Markdown."""
    result = _run(tfl, "unfused")
    item = result.targets[X86]
    _check_paired_but(item, tfl, unpaired=1)
    ((name, why),) = item.unpaired_reasons.items()
    assert item.unpaired == [name] and why.startswith("the value before RELU") and tfl["middle"] in why
    assert item.first_divergent is None and min(x.sqnr_db for x in item.layers) > 100     # the same float kernels
    back = Explanation.from_json(result.to_json())
    assert back.targets[X86].unpaired_reasons == item.unpaired_reasons
    assert back.targets[X86].layers[2].location == item.layers[2].location != []
    assert f"`{name}`: the value before RELU" in markdown_table(result)
    console = Console(record=True, width=200)
    print_explanation(console, result)
    assert name in console.export_text()
    per_channel = plan(tfl["per_channel"], tfl["fp32"], tmp_path)
    assert tfl["middle"] not in {s.fp32 for s in per_channel.sources}
    ((name, why),) = per_channel.reasons.items()
    assert "per channel (axis 3, 16 scales)" in why


def _check_paired_but(item, tfl, unpaired):
    assert [x.tensor for x in item.layers] == tfl["layers"], _table(item)
    assert len(item.unpaired) == unpaired and item.error == ""


def test_models_with_nothing_in_common_are_refused_in_one_line(tfl, tmp_path):
    import modelkit

    other = modelkit.save_tflite(modelkit.tflite_bytes("float"), "other.tflite", tmp_path)
    with pytest.raises(InputError, match="nothing to pair"):
        plan(other, tfl["fp32"], tmp_path)


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_located_in_the_tiers_containers(tiergate_home, tfl):
    """The x86_64 and the emulated arm64 LiteRT tiers, 4 samples: both defects of the full-integer family."""
    for kind in ("int8_default_range", "island_default_range"):
        result = explain(tfl[kind], tfl["fp32"], tfl["eval"], resolve(f"{X86},{ARM}"), runner=docker_runner(),
                         samples=4)
        for name, machine in ((X86, "x86_64"), (ARM, "aarch64")):
            item = result.targets[name]
            assert item.machine == machine, (name, item.error)
            _check_paired(item, tfl)
            assert item.first_divergent == tfl["middle"], (kind, name, _table(item))


def _harness():
    import importlib.util
    import sys

    from tiergate.paths import containers_dir

    folder = containers_dir() / "harness"
    sys.path.insert(0, str(folder))           # harness_cpu.py, beside the script
    try:
        spec = importlib.util.spec_from_file_location("tiergate_explain_script", folder / "tiergate_explain.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def test_values_an_op_wrote_over_in_place_are_not_compared(tfl):
    """tflite-runtime 2.14 runs ADD in place even with experimental_preserve_all_tensors (measured: the max pool's
    output held the ADD's after invoke): the dump script finds such inputs (they hold bitwise what the op wrote)
    and does not save them; the pairing says why they are missing."""
    harness = _harness()
    ops = [{"index": 0, "op": "ADD", "inputs": [0, 1], "outputs": [2]}]
    names = {0: "pool", 1: "shift", 2: "sum"}
    pool, total = [np.zeros((1, 4)), np.ones((1, 4))], [np.ones((1, 4)), np.full((1, 4), 2.0)]
    assert harness.overwritten(ops, names, {"pool": pool, "sum": total}) == {}
    assert harness.overwritten(ops, names, {"pool": total, "sum": total}) == {"pool": "ADD"}
    assert harness.unique_names([{"index": 0, "name": "a"}, {"index": 1, "name": "a"}, {"index": 2, "name": ""},
                                 {"index": 3, "name": "b"}]) == {0: "a#0", 1: "a#1", 2: "#2", 3: "b"}
    from tiergate.explain.tflite_pairing import runtime_checked

    sources = plan(tfl["int8"], tfl["fp32"], tfl["eval"].parent / "w").sources
    pool = next(s for s in sources if s.fp32 == "MaxPool2d")
    kept, reasons = runtime_checked(sources, {"candidate_overwritten": {pool.tensor: "ADD"}})
    assert pool not in kept and len(kept) == len(sources) - 1
    assert reasons == {pool.tensor: "the tier's runtime ran ADD in place over its values (tflite-runtime does, "
                                    "even preserving all tensors): they are gone"}


def test_a_pair_whose_op_the_runtime_runs_otherwise_is_dropped_with_why(tfl):
    """The dump script reports the graph the interpreter built; a pair whose candidate tensor the runtime writes
    with another op than the file says is not compared (and a dump from before that report is taken as is)."""
    from tiergate.explain.tflite_pairing import runtime_checked

    sources = plan(tfl["int8"], tfl["fp32"], tfl["eval"].parent / "w").sources
    conv = next(s for s in sources if s.fp32 == tfl["middle"])
    made = [s for s in sources if s.candidate_op != "input"]
    graph = {"names": {str(k): s.tensor for k, s in enumerate(made)},
             "ops": [{"index": k, "op": "DEPTHWISE_CONV_2D" if s is conv else s.candidate_op, "inputs": [],
                      "outputs": [k]} for k, s in enumerate(made)]}
    kept, reasons = runtime_checked(sources, {"candidate_graph": graph})
    assert kept == [s for s in sources if s is not conv] and list(reasons) == [conv.tensor]
    assert reasons[conv.tensor] == "the tier's runtime computes it with DEPTHWISE_CONV_2D, the file with CONV_2D"
    assert runtime_checked(sources, {}) == (sources, {})
