"""The graph rules on TVM's lowered graph, real compiles (the compiler image, x86_64): what the tier runs, not what
the file says. The Relax frontend drops an Identity between BatchNormalization and LeakyRelu (no unfused-activation
there), FuseOps leaves the convolution and the batch_norm in two kernels (unfolded-batchnorm), FuseOps switched off
leaves every activation alone, and a QDQ model computes in float."""

from __future__ import annotations

import json

import pytest

import modelkit as m
from tiergate.cli.main import main
from test_tvm_gate import TARGETS

pytestmark = [pytest.mark.docker, pytest.mark.slow]
X86 = "x86_64-cpu-tvm"
NOFUSE = "x86_64-cpu-tvm-nofuse"


def _inspect(capsys, monkeypatch, home, path, targets):
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    code = main(["inspect", str(path), "--target", targets, "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err + out
    return json.loads(out)


def _on(report, target, rule):
    return [f for f in report["findings"] if f["rule"] == rule and f["basis"] == "runtime" and f["target"] == target]


def test_lint_judges_the_kernels_tvm_runs(tvm_home, tmp_path, capsys, monkeypatch):
    catalogue = tmp_path / "targets"
    catalogue.mkdir()
    text = (TARGETS / f"{X86}.toml").read_text()
    (catalogue / f"{X86}.toml").write_text(text)
    nofuse = text.replace("threads = 1\n", 'threads = 1\ndisabled_passes = ["FuseOps"]\n')
    (catalogue / f"{NOFUSE}.toml").write_text(nofuse)
    monkeypatch.setenv("TIERGATE_TARGETS_DIR", str(catalogue))
    path = m.save(m.conv_net(identity=True, batchnorm=True), "ident.onnx", tmp_path)
    report = _inspect(capsys, monkeypatch, tvm_home, path, f"{X86},{NOFUSE}")
    kernels = report["runtime"][X86]["kernels"]
    assert report["runtime"][X86]["compile"]["kernels_after"] == "FuseOps"
    assert [k["ops"][0][0] for k in kernels][:2] == ["conv2d", "batch_norm"]
    assert [op[0] for op in kernels[1]["ops"]] == ["batch_norm", "leaky_relu"]    # the Identity is gone
    assert not any(f["rule"] == "unfused-activation" and f["basis"] == "file" for f in report["findings"])
    assert _on(report, X86, "unfused-activation") == []
    (bn,) = _on(report, X86, "unfolded-batchnorm")
    assert "conv2d+add -> batch_norm+leaky_relu" in bn["message"]          # the bias add fused into the conv
    # FuseOps off: the activations run alone, and the finding says why
    apart = _on(report, NOFUSE, "unfused-activation")
    assert apart and all("FuseOps is switched off" in f["message"] for f in apart)
    assert any("leaky_relu runs in a kernel apart from batch_norm" in f["message"] for f in apart)
    assert report["runtime"][NOFUSE]["compile"]["kernels_after"] == "FoldConstant"


def test_a_qdq_model_computes_in_float_on_tvm(tvm_home, capsys, monkeypatch):
    report = _inspect(capsys, monkeypatch, tvm_home, m.quantized_path(), X86)
    kernels = report["runtime"][X86]["kernels"]
    computing = [k for k in kernels if any(op[1] == 4 for op in k["ops"])]
    assert computing and all(op[2][0] == "float32" for k in computing for op in k["ops"] if op[1] == 4)
    assert any(op[0] == "dequantize" for k in kernels for op in k["ops"])
    (island,) = _on(report, X86, "float-island")
    assert f"all {len(computing)} compute kernel(s)" in island["message"] and "fake quantization" in island["message"]
