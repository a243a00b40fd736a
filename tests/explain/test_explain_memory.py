"""explain's dumps in bounded memory (issue 45): a model whose tensors are large (models.wide_conv: about 12 MB a
sample to dump, as a 320x320 detector's are about 190 MB) is dumped a sample at a time, its sample count sized to
the tier's memory limit, and explained within that limit; a tier whose runtime cannot hold the model at all is an
out-of-memory reason with exit 2, never an unreachable engine and never exit 0 with an empty explanation."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

import modelkit
import models
from tiergate.cli.main import main
from tiergate.execution.explain import HostRunner, explain
from tiergate.paths import targets_dir
from tiergate.targets import ContainerLimits, resolve

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    return models.write_wide_set(tmp_path_factory.mktemp("wide"))


def _small_class(tmp_path, monkeypatch, mb: int) -> str:
    """A copy of the x86 class with `mb` MB of memory, in a catalogue of its own."""
    catalogue = tmp_path / "targets"
    shutil.copytree(targets_dir(), catalogue)
    text = (catalogue / f"{X86}.toml").read_text().replace("memory_limit_mb = 2048", f"memory_limit_mb = {mb}")
    assert f"memory_limit_mb = {mb}" in text
    name = f"x86-{mb}mb"
    (catalogue / f"{name}.toml").write_text(text)
    monkeypatch.setenv("TIERGATE_TARGETS_DIR", str(catalogue))
    return name


def test_the_sample_count_is_sized_to_the_tier_s_memory_and_the_dump_is_streamed(tiergate_home, wide):
    """On this host (HostRunner): a 40 MB tier takes 3 of the 32 samples (12 MB each), says why, and still locates
    the defect; the dump's files hold exactly those samples."""
    (dc,) = resolve(X86)
    small = dataclasses.replace(dc, limits=ContainerLimits(memory="40m"))
    item = explain(wide["default_range"], wide["fp32"], wide["eval"], [small], runner=HostRunner()).targets[X86]
    assert item.error == "" and item.first_divergent == "wide"
    assert 10 * 2**20 < item.sample_bytes < 14 * 2**20
    assert item.samples == 40 * 2**20 // item.sample_bytes == 3
    assert "3 of 32 samples" in item.samples_note and "memory limit (40 MB)" in item.samples_note
    # the whole tier's memory: every sample
    full = explain(wide["default_range"], wide["fp32"], wide["eval"], [dc], runner=HostRunner()).targets[X86]
    assert full.samples == 32 and full.samples_note == "" and full.first_divergent == "wide"


def test_a_sample_whose_shape_changes_is_dropped_by_the_stream(tmp_path):
    """The dump script's sink: a tensor whose shape changes between samples, or that a sample lacks, is not kept
    (not comparable); the others are one [samples, ...] array each."""
    from test_explain_tflite import _harness

    sink = _harness().Sink(str(tmp_path), "m", 2)
    sink.add(["a", "b", "c"], [np.zeros((2, 3), np.float32), np.zeros(4, np.uint8), np.ones(1)])
    sink.add(["a", "b"], [np.ones((2, 3), np.float32), np.zeros(5, np.uint8)])
    assert sink.close() == {"t0": "a"}
    kept = np.load(tmp_path / "m.t0.npy")
    assert kept.shape == (2, 2, 3) and kept[1].min() == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["m.t0.npy"]


@pytest.mark.docker
@pytest.mark.slow
def test_a_tier_of_160_mb_explains_a_dump_that_would_not_fit_it(tiergate_home, wide, tmp_path, monkeypatch, capsys):
    """The whole dump (32 samples of both models) is about 380 MB, twice the tier's 160 MB: the container holds one
    sample at a time, dumps 13 samples (160 MB of tensors) and stays within its limit."""
    small = _small_class(tmp_path, monkeypatch, 160)
    code = main(["explain", "-c", str(wide["default_range"]), "-r", str(wide["fp32"]), "-d", str(wide["eval"]),
                 "-t", small, "--json"])
    out, err = capsys.readouterr()
    item = json.loads(out)["targets"][small]
    assert code == 0 and item["error"] == "" and item["first_divergent"] == "wide", err
    assert 32 * item["sample_bytes"] > 2 * 160 * 2**20                   # what holding every sample would take
    assert item["samples"] == 160 * 2**20 // item["sample_bytes"] < 32 and "of 32 samples" in item["samples_note"]
    assert 0 < item["peak_bytes"] < 160 * 2**20


@pytest.mark.docker
@pytest.mark.slow
def test_a_tier_too_small_for_the_model_is_an_out_of_memory_reason_and_exit_2(tiergate_home, tmp_path,
                                                                              monkeypatch, capsys):
    small = _small_class(tmp_path, monkeypatch, 96)
    hungry = modelkit.write(modelkit.memory_hungry(features=8), tmp_path / "hungry.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32))
    code = main(["explain", "-c", str(hungry), "-r", str(hungry), "-d", str(tmp_path / "x.npz"), "-t",
                 f"{X86},{small}", "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 2 and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("tiergate: error: explain could not be made on ") and "out of memory" in line
    assert "96" in line and "unreachable" not in line
    assert "out of memory" in doc["targets"][small]["error"]
    assert doc["targets"][X86]["error"] == "" and doc["targets"][X86]["layers"]    # the other tier's answer is kept
