"""Device figures through the whole gate (`tiergate gate`), real Docker, real onnxruntime, real QEMU.

- every run (candidate and reference) on x86_64 and on emulated arm64 carries the five figures in the
  gate JSON, with --profile its op profile;
- a 1 MB peak-memory budget rejects with a memory reason naming the figure, the limit and the tier;
- a device class whose memory limit is below what a model needs (modelkit.memory_hungry) is an OOM
  finding for that class, while the other class's results are kept.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import modelkit
from tiergate.cli.main import main
from tiergate.paths import targets_dir

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]
X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"
FIVE = ("peak_memory_bytes", "load_ms", "first_inference_ms", "artifact_bytes", "op_profile")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("device-gate")
    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(folder / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), folder / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + rng.normal(0, 1e-4, w.shape), softmax=True), folder / "cand.onnx")
    hungry = modelkit.write(modelkit.memory_hungry(features=8), folder / "hungry.onnx")
    return {"ref": ref, "cand": cand, "hungry": hungry, "data": folder / "eval.npz", "folder": folder}


def _gate_json(capsys, candidate, reference, data, targets, *extra):
    code = main(["gate", "--candidate", str(candidate), "--reference", str(reference), "--data", str(data),
                 "--targets", targets, "--json", *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.emulated
@pytest.mark.slow
def test_every_run_has_all_five_figures_on_x86_and_emulated_arm64(models, capsys, tiergate_home):
    code, doc, err = _gate_json(capsys, models["cand"], models["ref"], models["data"], f"{X86},{ARM}", "--profile")
    assert code == 0, (err, doc["reasons"])
    for name, emulated in ((X86, False), (ARM, True)):
        target = doc["metrics"][name]
        assert target["emulated"] is emulated
        for side in ("candidate", "reference"):
            figures = target["device"][side]
            assert all(figures[key] is not None for key in FIVE), (name, side, figures)
            assert figures["peak_memory_bytes"] > 10 * 2**20 and figures["load_ms"] > 0
            assert figures["first_inference_ms"] > 0 and figures["emulated"] is emulated
            assert figures["artifact_bytes"] == models[{"candidate": "cand", "reference": "ref"}[side]].stat().st_size
            # candidate and reference share the tier's container: its cgroup peak is neither's own
            assert figures["cgroup_peak_bytes"] is None and "VmHWM" in figures["memory_source"]
            assert figures["op_profile"]["available"] and figures["op_profile"]["by_op_type"]
        assert target["device_ratios"]["artifact_ratio"] == pytest.approx(1.0, abs=0.01)
    # QEMU user mode: the emulator's process holds the model, so its memory is larger than native
    assert doc["metrics"][ARM]["device"]["candidate"]["peak_memory_bytes"] > \
        doc["metrics"][X86]["device"]["candidate"]["peak_memory_bytes"]


def test_a_1_mb_peak_memory_budget_rejects_with_a_memory_reason(models, capsys, tiergate_home, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[override.x86-server]\nmax_peak_memory_mb = 1\n")
    code, doc, err = _gate_json(capsys, models["cand"], models["ref"], models["data"], X86, "--policy", str(policy),
                                "--report-dir", str(tmp_path / "report"), "--junit", str(tmp_path / "junit.xml"))
    assert code == 1, err
    failed = [c for c in doc["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["peak_memory_mb"]
    peak_mb = doc["metrics"][X86]["device"]["candidate"]["peak_memory_bytes"] / 2**20
    assert failed[0]["value"] == pytest.approx(peak_mb) and failed[0]["threshold"] == 1.0
    (reason,) = doc["reasons"]
    assert reason.startswith(f"{X86} (x86-server): peak_memory_mb is ") and "must be <= 1" in reason
    assert "max_peak_memory_mb on tier x86-server" in reason
    summary = (tmp_path / "report" / "gate-summary.md").read_text()
    assert "### Device figures" in summary and "peak_memory_mb" in summary
    junit = (tmp_path / "junit.xml").read_text()
    assert 'name="candidate.peak_memory_mb"' in junit and 'name="reference.load_ms"' in junit


def test_a_memory_limit_below_the_model_is_an_oom_finding_and_other_classes_keep_results(
        models, capsys, tiergate_home, tmp_path, monkeypatch):
    catalogue = tmp_path / "targets"
    shutil.copytree(targets_dir(), catalogue)
    small = (catalogue / f"{X86}.toml").read_text().replace("memory_limit_mb = 2048", "memory_limit_mb = 96")
    assert "memory_limit_mb = 96" in small
    (catalogue / "x86-96mb.toml").write_text(small)
    monkeypatch.setenv("TIERGATE_TARGETS_DIR", str(catalogue))
    unlabelled = tmp_path / "x.npz"          # the model against itself, judged by agreement (no classes here)
    with np.load(models["data"]) as npz:
        np.savez(unlabelled, x=npz["x"])
    code, doc, err = _gate_json(capsys, models["hungry"], models["hungry"], unlabelled, f"{X86},x86-96mb")
    assert code == 1, err
    oom = [c for c in doc["checks"] if c["name"] == "memory_limit"]
    assert {c["device_class"] for c in oom} == {"x86-96mb"} and len(oom) == 2      # candidate and reference
    assert all(c["threshold"] == 96.0 and "96 MB" in c["detail"] for c in oom)
    assert any(r.startswith("x86-96mb (x86-server): memory_limit is out of memory") for r in doc["reasons"])
    # the class with room ran to the end: all its checks pass, its figures say what the model needs
    assert all(c["passed"] for c in doc["checks"] if c["device_class"] == X86)
    figures = doc["metrics"][X86]["device"]["candidate"]
    assert figures["peak_memory_bytes"] > 96 * 2**20 + figures["baseline_memory_bytes"] // 2
