"""What the CLI prints is whole and its own (issue 45): tables off a terminal are never folded to 80 columns (a
lint message wrapped at 20 characters), and third parties' warnings stay off stderr (matplotlib's on an explain
report with no tier explained, onnxruntime's quantizer's on a model with a BatchNormalization)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

import modelkit
from tiergate.cli.main import main


def test_an_inspect_table_off_a_terminal_keeps_each_message_on_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    path = modelkit.write(modelkit.conv_net(batchnorm=True, identity=True), tmp_path / "bn.onnx")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "unfolded-batchnorm" in line)
    assert "normalization(s) run as their own kernel after a convolution, not folded into its weights" in row
    assert "judged on the file only" in row and len(row) > 200        # one line, as wide as its message


def test_a_terminal_width_is_honoured_when_columns_says_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    path = modelkit.write(modelkit.conv_net(batchnorm=True, identity=True), tmp_path / "bn.onnx")
    assert main(["inspect", str(path)]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 100


def test_the_explain_report_of_no_explained_tier_warns_nothing(tmp_path, capsys):
    from tiergate.explain import Explanation, TierExplain
    from tiergate.reports.explain_html import write_html

    result = Explanation("c.onnx", "r.onnx", {"x86": TierExplain("x86", 20.0, error="out of memory")})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_html(result, tmp_path / "explain.html")
    assert caught == [] and capsys.readouterr().err == ""
    assert "no tier was explained" in (tmp_path / "explain.html").read_text()


def test_the_quantizer_s_advice_stays_off_stderr(tmp_path, capfd):
    from tiergate.orchestrator.explain_ab import quant_settings, requantize

    fp32 = modelkit.write(modelkit.conv_net(batchnorm=True), tmp_path / "fp32.onnx")
    np.savez(tmp_path / "cal.npz", x=np.random.default_rng(0).normal(size=(4, 3, 8, 8)).astype(np.float32))
    capfd.readouterr()
    settings = {"format": "QDQ", "activation_type": "uint8", "weight_type": "int8", "per_channel": True,
                "reduce_range": False}
    out = requantize(fp32, tmp_path / "int8.onnx", tmp_path / "cal.npz", settings, [])
    assert Path(out).is_file() and quant_settings(out)["per_channel"]
    err = capfd.readouterr().err
    assert "WARNING" not in err and "out-of-range" not in err and "pre-processing" not in err, err
