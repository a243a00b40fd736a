"""A YOLO-style detector whose head concatenates boxes (pixels) and class scores ([0, 1]) in one output, as
ultralytics exports them (tests/taskkit.py), quantized by onnxruntime's own quantizer (issue 41): its INT8 keeps
the output's cosine yet loses every score; gated without labels it is REJECTed by its detections against FP32's,
lint names the Concat, and a byte-different copy of the FP32 model is PROMOTEd. Native x86 tier, through the CLI."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import taskkit
from tiergate.cli.main import main

pytestmark = [pytest.mark.docker, pytest.mark.slow]

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    folder = tmp_path_factory.mktemp("yolo")
    fp32 = folder / "yolo.onnx"
    onnx.save(taskkit.yolo_like(), str(fp32))
    np.savez(folder / "scenes.npz", images=taskkit.scenes(40, 1))
    calibration = taskkit.scenes(16, 2)
    return {"fp32": fp32, "data": folder / "scenes.npz",
            "int8": taskkit.yolo_int8(fp32, folder / "yolo_int8.onnx", calibration),
            "copy": taskkit.resaved(fp32, folder / "yolo_copy.onnx")}


def _gate(capsys, candidate, reference, data):
    capsys.readouterr()
    code = main(["gate", "-c", str(candidate), "-r", str(reference), "-d", str(data), "-t", X86, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_the_int8_that_lost_its_scores_is_rejected_without_labels(detector, capsys, task_home):
    code, doc, err = _gate(capsys, detector["int8"], detector["fp32"], detector["data"])
    assert code == 1 and doc["verdict"] == "REJECT", err
    check = next(c for c in doc["checks"] if c["name"] == "map50_ratio")
    assert not check["passed"] and check["value"] < 0.5 and "FP32's decoded outputs" in check["detail"]
    metrics = doc["metrics"][X86]
    assert metrics["outputs"]["output0"]["cosine"] > 0.99                      # the whole output still "agrees"
    assert metrics["outputs"]["output0:scores"]["sqnr_db"] < 3                 # its scores part does not
    assert metrics["outputs"]["output0:boxes"]["sqnr_db"] > 20
    assert metrics["task"]["recall50"]["candidate"] < 0.2 < metrics["task"]["recall50"]["reference"]
    finding = next(f for f in doc["findings"][X86] if f["rule"] == "mixed-range-scale")
    assert finding["severity"] == "warning" and "keeps about 0.4 levels" in finding["message"]
    assert [name[:6] for name in finding["node_names"]] == ["Concat"]


def test_a_byte_different_copy_of_the_fp32_detector_is_promoted(detector, capsys, task_home):
    code, doc, err = _gate(capsys, detector["copy"], detector["fp32"], detector["data"])
    assert code == 0 and doc["verdict"] == "PROMOTE", err
    assert next(c for c in doc["checks"] if c["name"] == "map50_ratio")["passed"]
    assert doc["metrics"][X86]["kinds"]["output0"]["layout"] == "yolo"
