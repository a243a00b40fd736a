"""`tiergate gate` end to end on a real classifier (digits CNN), real containers, x86 and emulated arm64."""

from __future__ import annotations

import json
from pathlib import Path
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from tiergate.cli.main import main

ONNX_TARGETS = "x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime"


def _gate(capsys, monkeypatch, home, *args):
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    code = main(["gate", *args, "--json"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_good_calibration_promoted_bad_rejected_on_both_tiers(demo_set, larger_eval, shared_home, capsys, monkeypatch,
                                                              tmp_path):
    good = demo_set.candidate("onnx-int8-entropy").path
    bad = demo_set.candidate("onnx-int8-badcal").path
    # 2,000 samples: on the 450 test images alone the good candidate is INCONCLUSIVE (test_unchanged_rerun...)
    base = ["--reference", str(demo_set.reference_onnx), "--data", str(larger_eval), "--targets", ONNX_TARGETS]

    code, out, err = _gate(capsys, monkeypatch, shared_home, "--candidate", str(good), *base,
                           "--junit", str(tmp_path / "good.xml"), "--report-dir", str(tmp_path / "good"))
    decision = json.loads(out)
    assert code == 0, err + out
    assert decision["verdict"] == "PROMOTE"
    assert {c["device_class"] for c in decision["checks"]} == set(ONNX_TARGETS.split(","))
    assert decision["metrics"]["arm64-cpu-onnxruntime"]["emulated"] is True
    suite = ET.parse(tmp_path / "good.xml").getroot()
    assert int(suite.get("tests")) == len(decision["checks"]) and int(suite.get("failures")) == 0
    assert "PROMOTE" in (tmp_path / "good" / "gate-summary.md").read_text()
    # runtime truth at intake: the graph each tier's runtime executes, made in that tier's own container
    runtime = decision["runtime"]
    assert runtime["x86_64-cpu-onnxruntime"]["machine"] == "x86_64"
    assert runtime["arm64-cpu-onnxruntime"]["machine"] == "aarch64"
    for dc in ONNX_TARGETS.split(","):
        graph = runtime[dc]
        assert graph["ok"] and graph["default_level"] == "all"
        assert list(graph["ops"]) == ["all"]                 # the level the run executes (inspect: every level)
        assert any(op.endswith("QLinearConv") or op.endswith("FusedConv") or op.endswith(":Conv")
                   for op in graph["ops"]["all"])
    assert "What each tier's runtime executes" in (tmp_path / "good" / "gate-summary.md").read_text()

    # every tier judged to its end: with early decision on, the first tier's final REJECT stops the others
    # (test_early_stop.py::test_a_final_reject_stops_the_other_tiers_runs)
    code, out, err = _gate(capsys, monkeypatch, shared_home, "--candidate", str(bad), *base,
                           "--junit", str(tmp_path / "bad.xml"), "--no-early-stop")
    decision = json.loads(out)
    assert code == 1, err + out
    assert decision["verdict"] == "REJECT"
    failed = {(c["device_class"], c["name"]) for c in decision["checks"] if not c["passed"]}
    # the right reasons, on every tier: labels exist, so accuracy decides; cosine and SQNR are evidence (warnings)
    assert failed == {(dc, "accuracy_ratio") for dc in ONNX_TARGETS.split(",")}
    for dc in ONNX_TARGETS.split(","):
        check = next(c for c in decision["checks"] if c["device_class"] == dc and c["name"] == "accuracy_ratio")
        assert check["interval"]["high"] < 0.99 and not check["inconclusive"]     # wholly below the threshold
        for metric in ("cosine", "sqnr_db"):
            assert any(w.startswith(f"{dc}: {metric}[probs] is ") and "evidence only" in w
                       for w in decision["warnings"]), decision["warnings"]
    assert not any(c["name"] in ("cosine", "sqnr_db") for c in decision["checks"])
    assert decision["cache_hits"] >= 1  # the FP32 reference's x86 run was reused from the first gate (arm64's ran
    # in the early decision's chunks there, unless another test of this home ran it whole)
    suite = ET.parse(tmp_path / "bad.xml").getroot()
    assert int(suite.get("failures")) == 2


@pytest.mark.docker
@pytest.mark.slow
def test_unchanged_rerun_starts_no_container(demo_set, shared_home, capsys, monkeypatch):
    import docker

    args = ["--candidate", str(demo_set.candidate("onnx-int8-entropy").path),
            "--reference", str(demo_set.reference_onnx), "--data", str(demo_set.eval_data),
            "--targets", "x86_64-cpu-onnxruntime"]
    first_code, first, _ = _gate(capsys, monkeypatch, shared_home, *args)
    # on the 450 test images the candidate differs from FP32 on one: its interval straddles 0.99
    (check,) = [c for c in json.loads(first)["checks"] if c["name"] == "accuracy_ratio"]
    assert first_code == 3 and json.loads(first)["verdict"] == "INCONCLUSIVE"
    assert check["inconclusive"] and check["interval"]["low"] < 0.99 <= check["interval"]["high"]
    assert check["samples_needed"] > 450
    client = docker.from_env()
    images = {json.loads((Path(p) / "result.json").read_text())["image_id"] for p in json.loads(first)["runs"].values()}

    def ours():   # containers of this gate's images (other work may share the engine)
        return {c.id for c in client.containers.list(all=True, ignore_removed=True) if c.attrs["Image"] in images}

    before = ours()
    code, out, err = _gate(capsys, monkeypatch, shared_home, *args)
    again = json.loads(out)
    assert code == first_code, err
    assert again["containers_started"] == 0 and again["cache_hits"] == 2
    assert ours() <= before
    assert again["checks"] == json.loads(first)["checks"]


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("case, expected", [
    ("wrong_name", "'image' is missing"),
    ("wrong_shape", "shape"),
    ("wrong_dtype", "dtype"),
    ("labels_length", "labels"),
])
def test_data_that_does_not_fit_the_model_exits_2(demo_set, tmp_path, capsys, case, expected):
    images = np.load(demo_set.eval_data)["image"]
    labels = np.load(demo_set.eval_data)["labels"]
    data = {
        "wrong_name": dict(pixels=images, labels=labels),
        "wrong_shape": dict(image=images.reshape(len(images), 64), labels=labels),
        "wrong_dtype": dict(image=images.astype(np.float64), labels=labels),
        "labels_length": dict(image=images, labels=labels[:-3]),
    }[case]
    path = _npz(tmp_path / f"{case}.npz", **data)
    code = main(["gate", "-c", str(demo_set.candidate("onnx-int8-entropy").path), "-r", str(demo_set.reference_onnx),
                 "-d", str(path), "-t", "x86_64-cpu-onnxruntime"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and expected in err and "Traceback" not in err


def test_unknown_device_class_exits_2(demo_set, capsys):
    code = main(["gate", "-c", str(demo_set.reference_onnx), "-r", str(demo_set.reference_onnx),
                 "-d", str(demo_set.eval_data), "-t", "x86_64-cpu-onnxruntime,pdp11-cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "pdp11-cpu" in err and len(err.strip().splitlines()) == 1


def test_policy_with_unknown_key_exits_2(demo_set, tmp_path, capsys):
    policy = tmp_path / "policy.toml"
    policy.write_text("[defaults]\nmin_cosine = 0.99\nmin_cosinus = 0.5\n")
    code = main(["gate", "-c", str(demo_set.reference_onnx), "-r", str(demo_set.reference_onnx),
                 "-d", str(demo_set.eval_data), "-t", "x86_64-cpu-onnxruntime", "--policy", str(policy)])
    err = capsys.readouterr().err
    assert code == 2 and "min_cosinus" in err and str(policy) in err


def test_format_that_the_target_cannot_run_exits_2(demo_set, capsys):
    code = main(["gate", "-c", str(demo_set.candidate("tflite-int8").path), "-r", str(demo_set.reference_tflite),
                 "-d", str(demo_set.eval_data), "-t", "x86_64-cpu-onnxruntime"])
    err = capsys.readouterr().err
    assert code == 2 and "tflite" in err and "x86_64-cpu-onnxruntime" in err
