"""PP-OCRv4's text recogniser (CTC) and text detector (a probability map) from rapidocr-onnxruntime 1.4.4, on
rendered lines and pages whose truth is known (issue 41): each INT8 judged by what the model is for, with labels
and without them (against FP32's own decoded outputs), on the native x86 tier through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from realmodels import taskdata
from tiergate.cli.main import main

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.slow]

X86 = "x86_64-cpu-onnxruntime"


def _gate(capsys, candidate, reference, data, *extra):
    capsys.readouterr()
    code = main(["gate", "-c", str(candidate), "-r", str(reference), "-d", str(data), "-t", X86, "--json", *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def _check(doc, name):
    return next(c for c in doc["checks"] if c["name"] == name)


@pytest.fixture(scope="module")
def rec(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("rec")
    model = real_model("ppocr_rec")
    x, texts = taskdata.rec_lines(160, 1)
    np.savez(folder / "lines.npz", x=x, labels=np.array(texts))
    np.savez(folder / "lines-unlabelled.npz", x=x)
    calibration, _ = taskdata.rec_lines(32, 7)
    return {"model": model, "folder": folder,
            "per_tensor": taskdata.rec_int8_per_tensor(model, folder, calibration),
            "dynamic": taskdata.rec_int8_dynamic(model, folder)}


@pytest.mark.parametrize("data", ["lines.npz", "lines-unlabelled.npz"])
def test_the_recogniser_s_per_tensor_int8_is_rejected_by_cer(rec, capsys, task_home, data):
    code, doc, err = _gate(capsys, rec["per_tensor"], rec["model"], rec["folder"] / data)
    cer = _check(doc, "cer_difference")
    assert code == 1 and doc["verdict"] == "REJECT" and not cer["passed"] and not cer["inconclusive"], err
    task = doc["metrics"][X86]["task"]
    assert task["cer"]["candidate"] > 0.9                       # the lines come out empty or garbled
    if data == "lines.npz":
        assert task["cer"]["reference"] < 0.15 and task["sequence_accuracy"]["candidate"] == 0.0
        assert task["sequence_accuracy"]["reference"] == pytest.approx(141 / 160)   # as the host's onnxruntime reads them
    else:
        assert task["cer"]["reference"] == 0.0 and "FP32's decoded outputs" in cer["detail"]
    assert doc["metrics"][X86]["kinds"]["softmax_11.tmp_0"]["alphabet_size"] == 6625


@pytest.mark.parametrize("data", ["lines.npz", "lines-unlabelled.npz"])
def test_the_recogniser_s_dynamic_int8_is_promoted_or_inconclusive_with_its_interval(rec, capsys, task_home,
                                                                                     data):
    code, doc, err = _gate(capsys, rec["dynamic"], rec["model"], rec["folder"] / data)
    cer = _check(doc, "cer_difference")
    assert doc["verdict"] in ("PROMOTE", "INCONCLUSIVE") and code in (0, 3), err
    assert cer["interval"]["low"] <= cer["value"] <= cer["interval"]["high"] and cer["interval"]["high"] < 0.05
    assert doc["quantized"] is True                              # dynamic quantization is quantization


@pytest.fixture(scope="module")
def det(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("det")
    model = real_model("ppocr_det")
    x, boxes = taskdata.det_pages(64, 1)
    (folder / "words.json").write_text(taskdata.coco(boxes))
    np.savez(folder / "pages.npz", x=x, labels=np.array("words.json"))
    np.savez(folder / "pages-unlabelled.npz", x=x)
    blank, _ = taskdata.det_pages(8, 3, blank=True)
    return {"model": model, "folder": folder, "blank": taskdata.det_int8(model, folder, blank, "blank")}


@pytest.mark.parametrize("data", ["pages.npz", "pages-unlabelled.npz"])
def test_the_detector_calibrated_on_blank_pages_is_rejected_by_text_box_iou(det, capsys, task_home, data):
    code, doc, err = _gate(capsys, det["blank"], det["model"], det["folder"] / data)
    iou = _check(doc, "mask_iou_ratio")
    assert code == 1 and doc["verdict"] == "REJECT" and not iou["passed"] and not iou["inconclusive"], err
    task = doc["metrics"][X86]["task"]["mask_iou"]
    assert task["candidate"] < 0.05
    if data == "pages.npz":        # the word boxes drawn at the map's resolution: FP32's text regions overlap them
        assert 0.3 < task["reference"] < 0.7 and "against labels" in iou["detail"]
    else:
        assert task["reference"] == 1.0
