"""Native latency that holds on a noisy machine (issue 24): PaddleOCR's text-direction classifier with its
BatchNormalizations left unfused (`kit.unfused_batchnorm`, the same outputs) against the FP32 model on the native
x86 tier. The candidate's calls are interleaved with the reference's in one process (harness_paired.py) and
`max_latency_ratio = 1.10` is decided on the per-pair ratios' interval: the unfused variant does not pass; the FP32
model against a byte-different copy of itself (as a rebuild makes it) passes, beside CPU hogs too. With an
incumbent the candidate's calls interleave with both, and `noninferior_latency` is decided on those pairs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tiergate.cli.main import main

from . import kit

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.slow]
X86 = "x86_64-cpu-onnxruntime"
LINES = 40


@pytest.fixture(scope="module")
def models(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("latency")
    source = real_model("paddleocr_cls")
    x, y = kit.text_lines(LINES, seed=0)
    np.savez(folder / "lines.npz", x=x, labels=y)
    policy = folder / "policy.toml"
    # accuracy off (40 lines cannot resolve it): these gates decide on the latency ratio
    policy.write_text("[defaults]\nmax_latency_ratio = 1.10\nmin_accuracy_ratio = 0.0\n")
    import onnx

    copy = onnx.load(str(source))
    copy.doc_string = "rebuilt"                    # the same graph and weights, another file (another hash)
    onnx.save(copy, str(folder / "rebuilt.onnx"))
    return {"reference": source, "unfused": kit.unfused_batchnorm(source, folder), "data": folder / "lines.npz",
            "policy": policy, "rebuilt": folder / "rebuilt.onnx"}


def gate(models, candidate, home, capsys, monkeypatch, incumbent=None):
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    code = main(["gate", "-c", str(candidate), "-r", str(models["reference"]), "-d", str(models["data"]),
                 "-t", X86, "--policy", str(models["policy"]), "--json"]
                + (["--incumbent", str(incumbent)] if incumbent else []))
    out, err = capsys.readouterr()
    doc = json.loads(out)
    return code, doc, next(c for c in doc["checks"] if c["name"] == "latency_ratio"), err


def test_the_unfused_variant_does_not_pass_max_latency_ratio_on_the_native_tier(models, tmp_path, capsys,
                                                                               monkeypatch):
    # the incumbent is the FP32 model rebuilt (another file): the candidate's calls interleave with both
    code, doc, check, err = gate(models, models["unfused"], tmp_path / "a", capsys, monkeypatch,
                                 incumbent=models["rebuilt"])
    metrics = doc["metrics"][X86]
    (noninferior,) = [c for c in doc["checks"] if c["name"] == "noninferior_latency"]
    assert not noninferior["passed"] and "interleaved call pairs" in noninferior["detail"], noninferior
    assert not check["passed"] and code != 0 and doc["verdict"] != "PROMOTE", err[-2000:]
    assert check["interval"]["method"].startswith("median of per-pair ratios")
    assert metrics["latency_pairs"] >= 100 and check["interval"]["high"] > 1.10
    assert check["interval"]["low"] > 1.0         # slower, beyond the pairs' noise
    with capsys.disabled():
        i = check["interval"]
        print(f"unfused / FP32 on {X86}: {i['estimate']:.3f} [{i['low']:.3f}, {i['high']:.3f}] over "
              f"{metrics['latency_pairs']} interleaved pairs; means' ratio of the two runs "
              f"{metrics['latency']['candidate']['mean_ms'] / metrics['latency']['reference']['mean_ms']:.3f}",
              file=sys.stderr)


def test_fp32_against_a_copy_of_itself_passes_beside_cpu_hogs(models, tmp_path, capsys, monkeypatch):
    # a hog on half the cores: the host is loaded, and the tier's one thread still gets a core's share
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(max(1, (os.cpu_count() or 2) // 2))]
    try:
        code, doc, check, err = gate(models, models["rebuilt"], tmp_path / "b", capsys, monkeypatch)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert check["passed"] and code == 0 and doc["verdict"] == "PROMOTE", (check["detail"], err[-2000:])
    assert check["interval"]["high"] <= 1.10 and 0.95 < check["interval"]["estimate"] < 1.05
    with capsys.disabled():
        i = check["interval"]
        print(f"FP32 / FP32 beside {len(hogs)} CPU hogs: {i['estimate']:.3f} [{i['low']:.3f}, {i['high']:.3f}] "
              f"over {doc['metrics'][X86]['latency_pairs']} pairs", file=sys.stderr)
