"""MediaPipe's TFLite models as shipped (float16 weights behind DEQUANTIZE), gated without labels on the native
TFLite tier (issue 41): the selfie segmenter against its exact FP32 widening is PROMOTEd; with its weights
snapped to a coarse grid (still float16: no quantization parameters anywhere) it is not; the "lite" hand
landmark model against the "full" one is REJECTed by its landmarks' error, which cosine did not see."""

from __future__ import annotations

import json

import numpy as np
import pytest

from realmodels import taskdata
from realmodels.kit import tflite_float32_weights
from tiergate.cli.main import main

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.slow, pytest.mark.tflite_extra]

TFLITE = "x86_64-cpu-tflite"


def _gate(capsys, candidate, reference, data):
    capsys.readouterr()
    code = main(["gate", "-c", str(candidate), "-r", str(reference), "-d", str(data), "-t", TFLITE, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.fixture(scope="module")
def selfie(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("selfie")
    shipped = real_model("selfie_segmentation")
    data = shipped.read_bytes()
    (folder / "fp32.tflite").write_bytes(tflite_float32_weights(data))
    (folder / "snapped4.tflite").write_bytes(taskdata.tflite_snapped(data, 4))
    np.savez(folder / "photos.npz", input_1=taskdata.photos(24, 256, 0))
    return {"shipped": shipped, "fp32": folder / "fp32.tflite", "snapped4": folder / "snapped4.tflite",
            "data": folder / "photos.npz"}


def test_the_segmenter_as_shipped_against_its_exact_fp32_widening_is_promoted(selfie, capsys, task_home):
    code, doc, err = _gate(capsys, selfie["shipped"], selfie["fp32"], selfie["data"])
    assert code == 0 and doc["verdict"] == "PROMOTE", err
    check = next(c for c in doc["checks"] if c["name"] == "mask_iou_ratio")
    assert check["passed"] and check["value"] == pytest.approx(1.0)
    assert doc["metrics"][TFLITE]["kinds"]["activation_10"]["kind"] == "map"


def test_the_segmenter_with_weights_snapped_to_a_coarse_grid_is_not_promoted(selfie, capsys, task_home):
    code, doc, err = _gate(capsys, selfie["snapped4"], selfie["fp32"], selfie["data"])
    assert doc["verdict"] != "PROMOTE" and code in (1, 3), err
    assert doc["quantized"] is False                           # no quantization parameters: it is "float"
    check = next(c for c in doc["checks"] if c["name"] == "mask_iou_ratio")
    assert not check["passed"] and check["value"] < 0.9
    assert doc["metrics"][TFLITE]["outputs"]["activation_10"]["cosine"] < 0.9


def test_the_lite_hand_landmark_model_against_the_full_one_is_rejected(real_model, capsys, task_home, tmp_path):
    np.savez(tmp_path / "photos.npz", input_1=taskdata.photos(24, 224, 1))
    code, doc, err = _gate(capsys, real_model("hand_landmark_lite"), real_model("hand_landmark_full"),
                           tmp_path / "photos.npz")
    assert code == 1 and doc["verdict"] == "REJECT", err
    task = doc["metrics"][TFLITE]["task"]
    assert task["landmark_nme[Identity]"]["outcome"] == "fail" and task["landmark_error[Identity]"]["candidate"] > 5
    assert doc["metrics"][TFLITE]["outputs"]["Identity"]["cosine"] > 0.95     # one number over points: "agrees"
