"""PaddleOCR's text-direction classifier compiled by TVM in the build step (docs/tvm.md) and run on both TVM tiers
(x86_64 native, arm64 cross-compiled and emulated): its input's symbolic height and width made static from the
evaluation data, its Reshape targets folded, and its outputs equal to onnxruntime's FP32 outputs on the host up to
float rounding."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tiergate.cli.main import main

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.emulated, pytest.mark.slow]

TVM_TARGETS = "x86_64-cpu-tvm,arm64-cpu-tvm"
SAMPLES = 24
MAX_ABS_DIFF = 1e-4     # probabilities; measured: about 3e-6 on both tiers


def test_paddleocr_compiled_by_tvm_matches_onnxruntime_on_both_tiers(real_model, realmodels_home, tmp_path, capsys):
    import onnxruntime as ort
    from realmodels.kit import text_lines

    model = real_model("paddleocr_cls")
    x, _ = text_lines(SAMPLES, seed=3)
    np.savez(tmp_path / "lines.npz", x=x)          # no labels: FP32 against itself, drift only
    code = main(["gate", "--candidate", str(model), "--reference", str(model), "--data", str(tmp_path / "lines.npz"),
                 "--targets", TVM_TARGETS, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err + out
    decision = json.loads(out)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    expected = session.run([name], {"x": x})[0]
    for target, machine in (("x86_64-cpu-tvm", "x86_64"), ("arm64-cpu-tvm", "aarch64")):
        folder = Path(decision["runs"][f"candidate/{target}"])
        result = json.loads((folder / "result.json").read_text())
        assert result["machine"] == machine and result["versions"]["tvm"] == "0.27.0.post1"
        with np.load(folder / "outputs.npz") as npz:
            assert list(npz.files) == [name]             # named as the ONNX model's output
            got = npz[name]
        assert got.shape == expected.shape
        assert float(np.max(np.abs(got - expected))) < MAX_ABS_DIFF
        assert (got.argmax(1) == expected.argmax(1)).all()
        graph = decision["runtime"][target]
        assert graph["ok"] and len(graph["passes"]) > 1000
        assert graph["compile"]["inputs"] == [{"name": "x", "shape": [1, 3, 48, 192], "dtype": "float32"}]
