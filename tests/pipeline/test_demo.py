"""The README's main job: `tiergate demo` end to end on real containers, x86 and emulated arm64."""

from __future__ import annotations

import json
import re

import pytest

from tiergate.cli.main import main


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.tflite_extra
def test_demo_promotes_the_good_candidates_and_rejects_the_broken_one(tmp_path, monkeypatch, capsys):
    """... and says INCONCLUSIVE where 450 samples cannot decide, then decides on 2,000 (x86 only)."""
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home"))
    code = main(["demo"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "every candidate got the decision it was built for" in out
    for name in ("onnx-int8-entropy", "onnx-int8-badcal", "tflite-fp16", "tflite-int8"):
        assert name in out
    assert "(emulated)" in out and "(native)" in out
    # the ONNX INT8 candidate: INCONCLUSIVE on the 450 test images, with the samples that would decide
    text = " ".join(out.split())
    found = re.search(r"onnx-int8-entropy: x86_64-cpu-onnxruntime \(x86-server\): accuracy_ratio is ([\d.]+) \(95% CI "
                      r"\[([\d.]+), ([\d.]+)\]\), must be >= 0.99: inconclusive, needs about (\d+) samples", text)
    assert found, out[-4000:]
    estimate, low, high, needed = (float(v) for v in found.groups())
    assert low < 0.99 <= high and needed > 450
    # the demo's confirmation gates it on 2,000 samples (more than it asked for); exit 0 above means PROMOTE there
    assert needed <= 2000
    report = json.loads((tmp_path / "home" / "demo" / "report" / "report.json").read_text())
    html = (tmp_path / "home" / "demo" / "report" / "report.html").read_text()
    assert 'id="plot-tier-x86-server"' in html and (tmp_path / "home" / "demo" / "report" / "plotly.min.js").is_file()
    tiers = set(report["tiers"])
    assert {"x86-server", "cortex-a"} <= tiers

    from tiergate.registry import Registry

    with Registry(f"sqlite:///{tmp_path / 'home' / 'registry.db'}") as registry:
        verdicts = {d.artifact_sha: d.verdict for d in registry.decisions("digits-cnn")}
        names = {a.sha256: a.tags.get("demo") for a in registry.artifacts("digits-cnn")}
    by_name = {names[sha]: verdict for sha, verdict in verdicts.items()}
    assert by_name == {"onnx-int8-entropy": "inconclusive", "onnx-int8-badcal": "reject",
                       "tflite-fp16": "promote", "tflite-int8": "promote"}

    # the badly calibrated candidate explained: which layer, on which tier, and the candidates that fix it
    assert "first divergent layer" in out and "Candidates that fix it, smallest first" in out
    assert "explain report:" in out
    folder = tmp_path / "home" / "demo" / "report" / "explain"
    explained = json.loads((folder / "explain.json").read_text())
    assert set(explained["targets"]) == {"x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"}
    for name, item in explained["targets"].items():
        assert item["error"] == "" and item["layers"], name
        assert item["first_divergent"] in {layer["tensor"] for layer in item["layers"]}, name
    # ... recorded with its decision: the report's REJECT cells link to its explain page
    (badcal,) = [d for d in report["decisions"] if names.get(d["artifact_sha"]) == "onnx-int8-badcal"]
    assert badcal["verdict"] == "reject" and badcal["explained"]
    assert report["explanations"][str(badcal["id"])]["targets"].keys() == explained["targets"].keys()
    assert f'href="decisions/explain-{badcal["id"]}.html"' in html
    page = (tmp_path / "home" / "demo" / "report" / "decisions" / f"explain-{badcal['id']}.html").read_text()
    assert "Candidates that fix it" in page
    # the fixes, gated on both tiers: a recalibrated INT8 passes with no layer in float (the old mixed-precision
    # candidate kept 6 of 7 layers in float), and it comes first
    fixes = explained["fixes"]
    int8 = fixes["candidate"]
    assert not int8["passes"] and int8["tiers"]["x86_64-cpu-onnxruntime"]["verdict"] == "fail"
    best = fixes["fixes"][0]
    assert best["passes"] and best["method"] == "recalibrated" and best["float_layers"] == [], fixes["fixes"]
    assert {tier["verdict"] for tier in best["tiers"].values()} == {"pass"} and len(best["tiers"]) == 2
    assert (folder / "fixes" / f"{best['name']}.onnx").is_file()
    assert "float-set" in {f["name"] for f in fixes["fixes"]}
    # emulated gates are the dear ones: once a recalibration passes everywhere, no other is gated on arm64
    arm = "arm64-cpu-onnxruntime"
    gated = [f for f in fixes["fixes"] if f["method"] == "recalibrated" and f["tiers"][arm]["verdict"] != "not gated"]
    assert [f["name"] for f in gated if f["passes"]] == [best["name"]], fixes["fixes"]
    assert (folder / "explain.html").is_file() and "first divergent" in (folder / "explain.md").read_text()
    assert "Candidates that fix it" in (folder / "explain.md").read_text()
