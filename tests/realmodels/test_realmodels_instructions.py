"""Instructions per inference on the emulated arm64 tier (issue 24): PaddleOCR's text-direction classifier with a
no-op Clip slipped between each Conv and its BatchNormalization (`kit.unfused_batchnorm`: the same outputs, but
onnxruntime fuses the Clip into the Conv and the normalization no longer folds). Its time cannot be gated under
QEMU; its guest instructions per call can, exactly: `max_instructions_ratio = 1.05` rejects it on the emulated
tier while the FP32 model against itself passes, the same model in two fresh homes counts the same, and a CPU hog
beside the run changes nothing.

The counting QEMU is built by scripts/setup (scripts/build-counting-qemu); these tests skip only where it is not
set up, naming the script."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tiergate.cli.main import main

from . import kit

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.emulated, pytest.mark.slow,
              pytest.mark.counting]
ARM = "arm64-cpu-onnxruntime"
LINES = 20


@pytest.fixture(scope="module")
def models(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("insn")
    source = real_model("paddleocr_cls")
    x, y = kit.text_lines(LINES, seed=0)
    np.savez(folder / "lines.npz", x=x, labels=y)
    policy = folder / "policy.toml"
    # accuracy off (20 lines cannot resolve it: inconclusive): these gates decide on instructions alone
    policy.write_text("[defaults]\nmax_instructions_ratio = 1.05\nmin_accuracy_ratio = 0.0\n")
    return {"reference": source, "unfused": kit.unfused_batchnorm(source, folder), "data": folder / "lines.npz",
            "policy": policy}


def gate(models, candidate, home, capsys, monkeypatch):
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    code = main(["gate", "-c", str(candidate), "-r", str(models["reference"]), "-d", str(models["data"]),
                 "-t", ARM, "--policy", str(models["policy"]), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def check(doc, name):
    return next(c for c in doc["checks"] if c["name"] == name and c["device_class"] == ARM)


def test_the_unfused_variant_fails_instructions_ratio_and_fp32_against_itself_passes(models, tmp_path, capsys,
                                                                                     monkeypatch):
    code, doc, err = gate(models, models["unfused"], tmp_path / "a", capsys, monkeypatch)
    ratio = check(doc, "instructions_ratio")
    device = doc["metrics"][ARM]["device"]
    assert code == 1 and doc["verdict"] == "REJECT" and not ratio["passed"], err[-2000:]
    assert ratio["value"] > 1.05 and ratio["threshold"] == 1.05
    for side in ("candidate", "reference"):
        assert device[side]["instructions_per_inference"] > 1e6, device[side]
        assert device[side]["load_instructions"] > 0 and device[side]["reads_per_inference"] is None  # off
        assert device[side]["instructions_spread"] < 0.005          # the timed calls of one model agree
    with capsys.disabled():
        print(f"unfused / FP32 instructions per inference on {ARM}: {ratio['value']:.4f} "
              f"({device['candidate']['instructions_per_inference']:.0f} / "
              f"{device['reference']['instructions_per_inference']:.0f})", file=sys.stderr)

    code, same, err = gate(models, models["reference"], tmp_path / "b", capsys, monkeypatch)
    assert code == 0 and same["verdict"] == "PROMOTE", err[-2000:]
    assert check(same, "instructions_ratio")["passed"]
    # two fresh homes (a and b), the same FP32 model: the same count within 0.5%
    a = device["reference"]["instructions_per_inference"]
    b = same["metrics"][ARM]["device"]["reference"]["instructions_per_inference"]
    assert abs(a - b) / a <= 0.005, (a, b)
    with capsys.disabled():
        print(f"FP32 instructions per inference in two fresh homes: {a:.0f}, {b:.0f}", file=sys.stderr)


def test_the_count_does_not_depend_on_host_load(models, tmp_path, capsys, monkeypatch):
    quiet = gate(models, models["reference"], tmp_path / "quiet", capsys, monkeypatch)[1]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        busy = gate(models, models["reference"], tmp_path / "busy", capsys, monkeypatch)[1]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    q = quiet["metrics"][ARM]["device"]["candidate"]
    b = busy["metrics"][ARM]["device"]["candidate"]
    assert abs(q["instructions_per_inference"] - b["instructions_per_inference"]) / q["instructions_per_inference"] \
        <= 0.005, (q, b)
    with capsys.disabled():
        print(f"instructions per inference quiet {q['instructions_per_inference']:.0f}, beside "
              f"{len(hogs)} CPU hogs {b['instructions_per_inference']:.0f}", file=sys.stderr)
