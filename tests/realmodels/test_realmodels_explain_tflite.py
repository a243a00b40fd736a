"""explain on MediaPipe's face detector (BlazeFace short range, float16 weights behind DEQUANTIZE ops, RELUs as
their own ops): its INT8 twin made by TensorFlow Lite's own quantizer (kit.tflite_int8, which fuses each RELU into
the op before it and drops the weights' DEQUANTIZE ops) pairs by structure wherever it holds the float model's
values; a copy with every tensor renamed pairs with the original everywhere. The images are synthetic (uniform in
[-1, 1], the model's input range): these tests are about pairing, not accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from tiergate.artifact import load_artifact
from tiergate.execution.explain import HostRunner, explain
from tiergate.explain import plan
from tiergate.explain.tflite_pairing import read_graph
from tiergate.targets import resolve

from . import kit

pytestmark = [pytest.mark.realmodels, pytest.mark.tflite_extra, pytest.mark.slow]
X86 = "x86_64-cpu-tflite"


@pytest.fixture(scope="module")
def face(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("face")
    source = real_model("face_detection")
    rng = np.random.default_rng(0)
    calibration = rng.uniform(-1, 1, (16, 128, 128, 3)).astype(np.float32)
    np.savez(folder / "eval.npz", input=rng.uniform(-1, 1, (8, 128, 128, 3)).astype(np.float32))
    return {"reference": source, "int8": kit.tflite_int8(source, folder, calibration), "eval": folder / "eval.npz",
            "folder": folder}


def test_its_int8_twin_pairs_every_tensor(face, tiergate_home):
    reference, int8 = read_graph(face["reference"]), read_graph(face["int8"])
    fused = [op for op in int8.ops if op.fused == "RELU"]
    assert fused and not [op for op in int8.ops if op.opcode == "RELU"]     # the quantizer fused every RELU
    result = explain(face["int8"], face["reference"], face["eval"], resolve(X86), runner=HostRunner(), samples=4)
    item = result.targets[X86]
    assert item.error == "" and item.unpaired == [], item.unpaired_reasons
    # every value the INT8 model holds is paired; the float model's pre-RELU values are the ones it does not hold
    held = len(reference.activations()) - len([op for op in reference.ops if op.opcode == "RELU"])
    assert len(item.layers) == held, (len(item.layers), held)
    assert item.layers[-1].tensor in reference.outputs and item.end_to_end_sqnr_db is not None


def test_a_renamed_copy_pairs_with_the_original_everywhere(face, tmp_path):
    import modelkit

    model = modelkit._unpack(face["reference"].read_bytes())
    graph = model.subgraphs[0]
    for i, tensor in enumerate(graph.tensors):
        if i not in graph.inputs:
            tensor.name = f"t{i}".encode()
    renamed = modelkit.save_tflite(modelkit._pack(model), "renamed.tflite", tmp_path)
    pairs = plan(renamed, face["reference"], tmp_path)
    assert pairs.unpaired == []
    assert {s.fp32 for s in pairs.sources} == set(read_graph(face["reference"]).activations())
    names = load_artifact(face["reference"]).handle.tensor_names        # by tensor index
    wrong = [(s.fp32, s.tensor) for s in pairs.sources if s.candidate_op != "input" and s.tensor != f"t{names.index(s.fp32)}"]
    assert wrong == []                  # each value paired with the very tensor that holds it
