"""Issue 42: bisect's inputs are checked, never silently narrowed: `--target a,b` bisected the first class alone,
and `--passes` with names the runtime never ran switched nothing off and concluded "not the cause". The real CLI
(in this process), real Docker on the native x86 tier for the pass names (they come from its runtime)."""

from __future__ import annotations

import numpy as np
import pytest

import modelkit
from tiergate.cli.main import main

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture
def models(tmp_path, tiergate_home):
    rng = np.random.default_rng(4204)      # tests/cache/test_run_seal.py's models: their images are built once
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + rng.normal(0, 1.5, w.shape), softmax=True), tmp_path / "bad.onnx")
    return ["bisect", "-c", str(cand), "-r", str(ref), "-d", str(tmp_path / "eval.npz")]


def _one_line(capsys, args) -> str:
    code = main(args)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("tiergate: error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (code, out, err)
    return errors[0]


def test_bisect_takes_one_class_and_refuses_the_others_aloud(models, capsys, tiergate_home):
    line = _one_line(capsys, models + ["--target", f"{X86},arm64-cpu-onnxruntime"])
    assert "bisect searches one device class" in line
    assert not (tiergate_home / "runs").exists()               # nothing was run


@pytest.mark.docker
def test_pass_names_the_runtime_never_ran_are_refused_with_the_closest(models, capsys):
    line = _one_line(capsys, models + ["--target", X86, "--passes", "ConstantFoldng", "--json"])
    assert "--passes ConstantFoldng" in line and "did you mean ConstantFolding?" in line
