"""explain on silero VAD, whose whole network sits inside `If(sr == 16000)` (then Ifs on tensor shapes inside it):
the reference is specialized to the branches that 16 kHz chunks take (explain/specialize.py), so the branch's tensors
pair like any others, and the explanation says which branch was taken and why.

The candidate is made honestly: onnxruntime's quantize_static (QDQ) quantizes nothing inside an If's branches (on the
original model it adds no Q/DQ at all), so kit.silero_int8 quantizes the FP32 model specialized the same way,
pre-processed, calibrated on 256 chunks of synthetic 16 kHz audio (near silence, noise, voiced sounds) each with the
state the FP32 model carries into it. The default range [-6, 6] is then injected at the middle of the network's seven
weighted layers (STFT, four encoder Conv + ReLU, LSTM, head): the third encoder ReLU, whose values reach ~330.
The eval chunks come through a data loader, as silero's users feed it (`state` on its axis 1, `sr` a constant)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tiergate.execution.explain import HostRunner, explain
from tiergate.targets import resolve

from . import kit

pytestmark = [pytest.mark.realmodels, pytest.mark.slow]

X86 = "x86_64-cpu-onnxruntime"
N_EVAL, N_CAL = 16, 256
ENCODER = "/encoder/2/activation/Relu_output_0"
# Measured here (x86_64 AVX2, onnxruntime 1.31, 16 chunks): the clean INT8 keeps every layer up to the head at 10.4 dB
# SQNR or more (8-bit activations over the STFT magnitude's long tail: the encoder sits at 10-18 dB, the LSTM at 12).
# The head's speech probability of these synthetic, non-speech chunks is ~0.001: a logit that 8-bit activations move
# by ~1 and the output's uint8 steps of 5e-4 leave it at -3.7 dB, though its absolute error is ~1e-3 (harmless to a 0.5
# decision). 6 dB separates the clean layers from the injected one (0.4 dB); at 6 dB the clean INT8's first divergent
# layer is the probability itself, after the encoder: explain reports that loss too, as it is.
THRESHOLD_DB = 6.0


@pytest.fixture(scope="module")
def vad(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("silero")
    source = real_model("silero_vad")
    feeds = kit.vad_feeds(source, kit.vad_chunks(N_EVAL + N_CAL, seed=0))
    _, int8 = kit.silero_int8(source, folder, feeds[N_EVAL:])
    model = onnx.load(str(int8))
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0].endswith(ENCODER))
    inits = {t.name: t for t in model.graph.initializer}
    inits[q.input[1]].CopyFrom(numpy_helper.from_array(np.array(12 / 255, np.float32), q.input[1]))
    inits[q.input[2]].CopyFrom(numpy_helper.from_array(np.array(128, np.uint8), q.input[2]))
    broken = folder / "silero_vad_16k_default_range.onnx"
    onnx.save(model, str(broken))
    return {"reference": source, "int8": int8, "broken": broken, "tensor": q.input[0],
            "data": kit.vad_loader(folder, feeds[:N_EVAL])}


def _explain(vad, candidate, runner):
    return explain(vad[candidate], vad["reference"], vad["data"], resolve(X86), runner=runner, samples=N_EVAL,
                   threshold_db=THRESHOLD_DB).targets[X86]


def _figures(item):
    return [(x.tensor.rsplit("__", 1)[-1], round(x.sqnr_db, 1)) for x in item.layers]


def test_a_default_range_inside_silero_vads_if_is_located(vad, realmodels_home):
    clean = _explain(vad, "int8", HostRunner())
    # the reference was specialized (the candidate, quantized from the specialized FP32, has no If left)
    assert {"node": "If_0", "branch": "then_branch", "why": "sr == 16000 in every sample",
            "models": ["reference"]} in clean.branches
    assert len(clean.branches) > 1 and clean.skipped == [] and clean.unpaired == []
    names = [x.tensor for x in clean.layers]
    assert vad["tensor"] in names and len(names) > 30               # the branch's tensors, paired
    sigmoid = next(x.tensor for x in clean.layers if x.op == "Sigmoid")
    assert clean.first_divergent == sigmoid, _figures(clean)          # nothing before the probability diverges
    item = _explain(vad, "broken", HostRunner())
    assert item.first_divergent == vad["tensor"], _figures(item)
    assert 0.25 * len(names) < names.index(vad["tensor"]) < 0.75 * len(names)     # in the middle of the network
    layer = next(x for x in item.layers if x.tensor == vad["tensor"])
    assert layer.range == [-6.02353, 5.97647] and layer.saturation > 0.05
    assert any(h.startswith(f"calibration range of {vad['tensor']} ") for h in item.calibration)


@pytest.mark.docker
def test_the_same_on_the_x86_tier(vad, realmodels_home):
    from tiergate.orchestrator.explain_ab import docker_runner

    item = _explain(vad, "broken", docker_runner())
    assert item.error == "" and item.machine == "x86_64"
    assert item.first_divergent == vad["tensor"], _figures(item)
    assert any(b["node"] == "If_0" and b["branch"] == "then_branch" for b in item.branches)
