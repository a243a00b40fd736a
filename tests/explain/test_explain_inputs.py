"""explain takes its inputs as the gate does: the evaluation data as an .npz or a loader FILE.py:FUNCTION (run once
and materialised, tiergate.evaldata.run_loader), and an ONNX model's size counts its external data files."""

from __future__ import annotations

import numpy as np

import modelkit
import models
from tiergate.execution.explain import HostRunner, explain
from tiergate.orchestrator.explain_ab import artifact_size
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


def test_a_loader_explains_like_its_npz(tiergate_home, mlp_set, tmp_path):
    loader = tmp_path / "load_eval.py"
    loader.write_text("import numpy as np\n\n\ndef samples():\n"
                      f"    with np.load({str(mlp_set['eval'])!r}) as npz:\n"
                      "        x, labels = npz['x'], npz['labels']\n"
                      "    for i in range(len(x)):\n"
                      "        yield {'x': x[i:i + 1]}, int(labels[i])\n")
    by_npz = explain(mlp_set["default_range"], mlp_set["fp32"], mlp_set["eval"], resolve(X86), runner=HostRunner())
    by_loader = explain(mlp_set["default_range"], mlp_set["fp32"], f"{loader}:samples", resolve(X86),
                        runner=HostRunner())
    a, b = by_npz.targets[X86], by_loader.targets[X86]
    assert b.error in ("", None) and b.first_divergent == a.first_divergent == models.TENSOR
    assert [round(x.sqnr_db, 3) for x in b.layers] == [round(x.sqnr_db, 3) for x in a.layers]


def test_the_size_column_counts_external_data(tmp_path):
    model = modelkit.write(modelkit.linear(np.ones((64, 32))), tmp_path / "m.onnx", external="m.weights")
    whole = model.stat().st_size + (tmp_path / "m.weights").stat().st_size
    assert (tmp_path / "m.weights").stat().st_size >= 64 * 32 * 4
    assert artifact_size(model) == whole
