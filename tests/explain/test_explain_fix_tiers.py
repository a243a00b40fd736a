"""explain --fix on a real tier (real Docker, real onnxruntime): the INT8 candidate with a default [-6, 6] range
at r is fixed by recalibrating the FP32 reference and by returning r's Q/DQ pair to float, each gated through the
one gate path against the FP32 reference with the INT8 candidate as incumbent."""

from __future__ import annotations

import json

import pytest

import models
from tiergate.cli.main import main
from tiergate.explain import fixes as fx

X86 = "x86_64-cpu-onnxruntime"


@pytest.mark.docker
@pytest.mark.slow
def test_fix_offers_a_recalibrated_int8_and_the_defects_pair_in_float(tiergate_home, mlp_set, tmp_path, capsys):
    out = tmp_path / "fixes"
    args = ["explain", "-c", str(mlp_set["default_range"]), "-r", str(mlp_set["fp32"]), "-d", str(mlp_set["eval"]),
            "-t", X86, "--fix", str(out), "--calibration-data", str(mlp_set["cal"]), "--policy",
            str(mlp_set["policy"]), "--out", str(tmp_path / "report")]
    code = main([*args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    fixes = doc["fixes"]
    assert code == 0 and doc["targets"][X86]["first_divergent"] == models.TENSOR
    int8 = fixes["candidate"]
    assert not int8["passes"] and int8["tiers"][X86]["verdict"] == "fail" and int8["float_layers"] == []
    by_name = {f["name"]: f for f in fixes["fixes"]}
    recalibrated = [f for f in fixes["fixes"] if f["method"] == fx.RECALIBRATED]
    named = {f["name"] for f in recalibrated} | {other for f in recalibrated for other in f["same_as"]}
    assert named == {"recal-percentile-99.99", "recal-percentile-99.999", "recal-entropy", "recal-minmax"}
    for fix in recalibrated:       # a method that made an earlier one's very bytes is named with it, not gated again
        assert all((out / f"{other}.onnx").read_bytes() == (out / f"{fix['name']}.onnx").read_bytes()
                   for other in fix["same_as"])
    assert len({(out / f"{name}.onnx").read_bytes() for name in named}) == len(recalibrated)
    assert any(f["passes"] for f in recalibrated) and all(f["float_layers"] == [] for f in recalibrated)
    float_set = by_name["float-set"]
    assert float_set["passes"], float_set["reasons"]
    assert [layer["tensor"] for layer in float_set["float_layers"]] == [models.TENSOR]
    assert {"add1", "fc2"} <= set(float_set["float_nodes"])
    assert float_set["gates"] <= fx.max_gates(len(fixes["ranked_layers"]) - len(fixes["left_out"]))
    assert "recal-percentile-99.99+float-set" not in by_name            # (3) only when neither alone passes
    # each tier's verdict carries the accuracy check's interval, and the real tier its latency
    for fix in [int8, *fixes["fixes"]]:
        tier = fix["tiers"][X86]
        assert tier["check"].startswith("accuracy_ratio") and tier["low"] <= tier["estimate"] <= tier["high"]
        assert tier["latency_ms"] > 0 and not tier["emulated"]
    assert int8["tiers"][X86]["high"] < 0.95 <= float_set["tiers"][X86]["low"]
    # smallest first: passing before failing, then fewer layers in float, then fewer bytes; named by method
    order = [(not f["passes"], len(f["float_layers"]), f["size_bytes"]) for f in fixes["fixes"]]
    assert order == sorted(order) and fixes["passing"][0] == fixes["fixes"][0]["name"]
    for fix in fixes["fixes"]:
        assert fix["path"] == str(out / f"{fix['name']}.onnx") and (out / f"{fix['name']}.onnx").is_file()
    # one tier: one gate per candidate gated (the INT8 one, then each fix; a model gated already is not again)
    assert fixes["gates_run"] == 1 + sum(f["gates"] for f in fixes["fixes"])
    md = (tmp_path / "report" / "explain.md").read_text()
    html = (tmp_path / "report" / "explain.html").read_text()
    assert "Candidates that fix it, smallest first" in md and "| float-set | float set" in md
    assert "<tr class='pass'><td class='l'>" in html and "recal-entropy" in html
    # the text view says the same, from the caches (explain's dumps, the runs, the decisions)
    code = main(args)
    text = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "Candidates that fix it, smallest first" in text and "smallest fix that passes:" in text


def test_fix_onto_an_input_is_refused_before_work(tiergate_home, mlp_set, tmp_path, capsys):
    """An output path that is an input: OUT_DIR holding the candidate under a name --fix writes (exit 2, one line,
    nothing written); OUT_DIR that is a file."""
    import shutil

    out = tmp_path / "fixes"
    out.mkdir()
    candidate = shutil.copyfile(mlp_set["default_range"], out / "float-set.onnx")
    before = candidate.read_bytes()
    code = main(["explain", "-c", str(candidate), "-r", str(mlp_set["fp32"]), "-d", str(mlp_set["eval"]), "-t", X86,
                 "--fix", str(out), "--calibration-data", str(mlp_set["cal"])])
    err = capsys.readouterr().err
    assert code == 2 and "--fix" in err and "overwrite an input" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and candidate.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["float-set.onnx"]
    code = main(["explain", "-c", str(mlp_set["default_range"]), "-r", str(mlp_set["fp32"]), "-d",
                 str(mlp_set["eval"]), "-t", X86, "--fix", str(mlp_set["cal"]), "--calibration-data",
                 str(mlp_set["cal"])])
    err = capsys.readouterr().err
    assert code == 2 and "is a file; give a folder" in err
    code = main(["explain", "-c", str(mlp_set["default_range"]), "-r", str(mlp_set["fp32"]), "-d",
                 str(mlp_set["eval"]), "-t", X86, "--fix", str(out)])
    assert code == 2 and "--fix needs --calibration-data" in capsys.readouterr().err


@pytest.mark.docker
@pytest.mark.slow
def test_the_digits_default_range_case_keeps_the_gemm_that_holds_r_in_float(tiergate_home, tmp_path, capsys):
    """An exporter's digits MLP (nodes unnamed), r = Relu(Gemm(x)) given the default range: the Relu is fused into
    the candidate's Gemm, so the node that holds r is that Gemm; --mixed-precision keeps it (and r's reader) in
    float, writes the model and its gate does not REJECT it."""
    import onnx

    paths = models.write_digits_set(tmp_path / "digits")
    out = tmp_path / "mixed.onnx"
    code = main(["explain", "-c", str(paths["default_range"]), "-r", str(paths["fp32"]), "-d", str(paths["eval"]),
                 "-t", X86, "--mixed-precision", str(out), "--calibration-data", str(paths["cal"]), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["targets"][X86]["first_divergent"] == models.TENSOR
    mixed = doc["mixed_precision"]
    assert mixed["int8"]["verdict"] == "REJECT" and mixed["mixed"] is not None, mixed.get("note")
    assert mixed["mixed"]["verdict"] != "REJECT" and code in (0, 1) and out.is_file(), mixed["mixed"]["reasons"]
    assert {"Gemm:h", "Relu:r"} <= set(mixed["mixed"]["excluded"])      # the Gemm that holds r, named by its output
    floats = {n.op_type for n in onnx.load(out).graph.node if n.name in ("Gemm:h", "Gemm:logits")}
    assert floats == {"Gemm"} and mixed["trail"] and mixed["gates"] <= fx.max_gates(len(mixed["trail"]) + 1)


@pytest.mark.docker
@pytest.mark.slow
def test_fix_judges_the_fixes_by_the_user_s_metric_and_shows_its_interval(tiergate_home, mlp_set, tmp_path, capsys):
    """explain takes the gate's --policy and --metric: with top-1 accuracy off and the user's own metric (the hits
    of the label output) gated at 0.95 of FP32's, each tier's cell shows that metric with its interval, the INT8
    candidate fails by it and a fix passes by it."""
    metric = tmp_path / "hits.py"
    metric.write_text("def hits(outputs, labels):\n    y = outputs['y']\n"
                      "    return float((y.argmax(1) == labels).mean())\n")
    policy = tmp_path / "policy.toml"
    policy.write_text("[defaults]\nmin_accuracy_ratio = false\n[metrics.hits]\nmin_ratio = 0.95\n")
    code = main(["explain", "-c", str(mlp_set["default_range"]), "-r", str(mlp_set["fp32"]), "-d", str(mlp_set["eval"]),
                 "-t", X86, "--fix", str(tmp_path / "fixes"), "--calibration-data", str(mlp_set["cal"]),
                 "--policy", str(policy), "--metric", f"{metric}:hits", "--json"])
    fixes = json.loads(capsys.readouterr().out)["fixes"]
    int8 = fixes["candidate"]["tiers"][X86]
    assert int8["verdict"] == "fail" and int8["check"] == "hits_ratio" and int8["high"] < 0.95
    passing = [f["tiers"][X86] for f in fixes["fixes"] if f["passes"]]
    assert code == 0 and passing and all(t["check"] == "hits_ratio" and t["low"] >= 0.95 for t in passing)
