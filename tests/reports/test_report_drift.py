"""The drift report's data and page, from a registry filled with real runs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from report_kit import T0, populate

from tiergate.cli.main import main
from tiergate.registry import METRIC_KEYS, Registry, flat_metrics
from tiergate.registry.report_data import build_drift_report, report_metrics
from tiergate.reports.drift import cross_tier_matrix
from tiergate.reports.html import render_html, write_report


@pytest.fixture
def filled(tmp_path):
    with Registry(f"sqlite:///{tmp_path / 'registry.db'}", tmp_path / "store") as registry:
        yield registry, populate(registry, tmp_path)


def test_rows_per_tier_follow_the_registry(filled):
    registry, made = filled
    report = build_drift_report(registry, "digits")
    shas = made["shas"]
    assert [a["sha256"] for a in report["artifacts"]] == [shas["fp32"], shas["v1"], shas["v2"]]
    assert sorted(report["tiers"]) == ["cortex-a", "x86-server"]
    assert report["promoted"] == {"cortex-a": shas["v2"], "x86-server": shas["v2"]}
    rows = report["tiers"]["cortex-a"]["rows"]
    assert [r["artifact_sha"] for r in rows] == [shas["fp32"], shas["v1"], shas["v2"]]
    assert [r["decision"] for r in rows] == ["promote", "reject", "promote"]
    assert [r["promoted"] for r in rows] == [False, False, True]
    assert all(r["emulated"] for r in rows)
    assert not any(r["emulated"] for r in report["tiers"]["x86-server"]["rows"])
    v1 = registry.runs(artifact_sha=shas["v1"], device_class="x86_64-cpu-onnxruntime")[0]
    x86_v1 = report["tiers"]["x86-server"]["rows"][1]
    assert x86_v1["metrics"] == {k: float(v1.metrics[k]) for k in METRIC_KEYS}
    assert x86_v1["metrics"]["cost_per_1k"] == pytest.approx(0.002)
    labels, out = made["labels"], made["outputs"]["v1"]["x86_64-cpu-onnxruntime"]
    assert x86_v1["metrics"]["accuracy"] == pytest.approx(np.mean(out.argmax(1) == labels))
    assert x86_v1["reasons"] == ["cosine too low"] and x86_v1["cost_tags"] == {"billing": "edge-fleet"}


def test_cross_tier_matrix_is_computed_from_the_stored_outputs(filled):
    registry, made = filled
    cross = build_drift_report(registry, "digits")["cross_tier"]
    assert [(c["tier"], c["device_class"]) for c in cross["labels"]] == [
        ("cortex-a", "arm64-cpu-onnxruntime"), ("x86-server", "x86_64-cpu-onnxruntime")]
    arm = made["outputs"]["v2"]["arm64-cpu-onnxruntime"].astype(np.float64)
    x86 = made["outputs"]["v2"]["x86_64-cpu-onnxruntime"].astype(np.float64)
    expected = float(np.max(np.abs(arm - x86)))
    assert 0 < expected < 1e-4
    assert cross["max_abs_error"][0][1] == pytest.approx(expected, rel=1e-9)
    assert cross["max_abs_error"][1][0] == pytest.approx(expected, rel=1e-9)
    assert cross["max_abs_error"][0][0] == 0.0 and cross["cosine"][1][1] == pytest.approx(1.0)
    cos = np.sum(arm * x86, axis=1) / (np.linalg.norm(arm, axis=1) * np.linalg.norm(x86, axis=1))
    assert cross["cosine"][0][1] == pytest.approx(float(cos.mean()), rel=1e-12)


def test_since_keeps_later_artifacts_only(filled):
    registry, made = filled
    report = build_drift_report(registry, "digits", since=T0.replace(day=2))
    assert [a["sha256"] for a in report["artifacts"]] == [made["shas"]["v1"], made["shas"]["v2"]]
    assert all(len(t["rows"]) == 2 for t in report["tiers"].values())
    assert report["since"].startswith("2026-03-02")


def test_html_is_self_contained_with_one_plot_per_tier(filled, tmp_path):
    registry, _ = filled
    report = build_drift_report(registry, "digits")
    html_path, json_path = write_report(report, tmp_path / "out")
    page = html_path.read_text()
    for svg_id in ("plot-tier-cortex-a", "plot-tier-x86-server", "plot-cross-tier"):
        assert len(re.findall(f'<svg[^>]* id="{svg_id}"', page)) == 1
    assert "arm64-cpu-onnxruntime (emulated)" in page
    assert page.count('id="table-tier-') == 2 and 'id="table-cross-tier"' in page
    assert not re.search(r"<script|<link|(src|href)=\"https?:", page)
    assert json.loads(json_path.read_text())["promoted"] == report["promoted"]
    assert report["generated_at"] in page


def test_report_cli(filled, tmp_path, capsys):
    registry, _ = filled
    args = ["--registry", registry.url, "--store", registry.store.location]
    out = tmp_path / "report"
    assert main(["report", "--model", "digits", "--out", str(out), "--since", "2026-03-02", *args]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'report.html'}" in printed and f"wrote {out / 'report.json'}" in printed
    assert len(json.loads((out / "report.json").read_text())["artifacts"]) == 2
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for bad in (["--model", "nosuch"], ["--model", "a/b"], ["--model", "digits", "--since", "yesterday"],
                ["--model", "digits", "--out", str(a_file)]):
        assert main(["report", "--out", str(tmp_path / "x"), *bad, *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tiergate: error:")


def test_a_model_without_runs_still_reports(tmp_path):
    from report_kit import tiny_model
    from tiergate.registry.store import file_sha256

    with Registry(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "store") as registry:
        path = tiny_model(tmp_path / "m.onnx", np.ones((4, 3)), np.zeros(3))
        registry.add_artifact(path, sha256=file_sha256(path), model="lonely", format="onnx", precision="fp32",
                              fingerprint={})
        report = build_drift_report(registry, "lonely")
    assert report["tiers"] == {} and report["cross_tier"]["labels"] == []
    page = render_html(report)
    assert "No runs recorded" in page and "<svg" not in page


def test_unchanged_data_keeps_the_rendered_page_and_new_data_renders_again(filled, tmp_path):
    registry, _ = filled
    report = build_drift_report(registry, "digits")
    html_path, _ = write_report(report, tmp_path / "out")
    html_path.write_text(html_path.read_text() + "<!-- marker -->")
    later = {**report, "generated_at": "2099-01-01T00:00:00+00:00"}
    write_report(later, tmp_path / "out")
    assert html_path.read_text().endswith("<!-- marker -->")  # same data: not rendered again
    changed = {**later, "since": "2020-01-01T00:00:00+00:00"}
    write_report(changed, tmp_path / "out")
    assert "<!-- marker -->" not in html_path.read_text() and "2099-01-01" in html_path.read_text()


def test_report_metrics_read_the_flat_shape_the_gate_records():
    assert set(flat_metrics({})) == set(METRIC_KEYS) | {"emulated"}  # what the registry writes is what it reads
    recorded = {"accuracy": 0.75, "cosine": float("nan"), "sqnr_db": float("inf"), "max_abs_err": 3,
                "latency_p50_ms": True, "latency_p99_ms": "fast", "emulated": True}
    assert report_metrics(recorded) == {"accuracy": 0.75, "cosine": None, "sqnr_db": None, "max_abs_error": 3.0,
                                        "latency_p50_ms": None, "latency_p99_ms": None, "cost_per_1k": None,
                                        "peak_memory_mb": None, "load_ms": None, "first_inference_ms": None,
                                        "artifact_mb": None}
    figures = {"device": {"candidate": {"peak_memory_bytes": 3 * 1024 * 1024, "load_ms": 4.5,
                                        "first_inference_ms": 0.5, "artifact_bytes": 1024 * 1024}}}
    flat = flat_metrics(figures)
    assert (flat["peak_memory_mb"], flat["load_ms"], flat["first_inference_ms"], flat["artifact_mb"]) == \
        (3.0, 4.5, 0.5, 1.0)
    assert report_metrics(flat)["peak_memory_mb"] == 3.0


def test_cross_tier_matrix_from_given_outputs_only():
    rng = np.random.default_rng(3)
    a = {"y": rng.normal(size=(8, 5)), "z": rng.normal(size=(8, 2))}
    b = {"y": a["y"] + 0.01, "z": a["z"] - 0.5}
    odd = {"y": np.zeros((8, 4))}  # no output of the same shape as a's or b's
    labels = [{"tier": t} for t in ("t0", "t1", "t2", "t3")]
    matrix = cross_tier_matrix(labels, [a, b, None, odd])
    assert matrix["max_abs_error"][0][1] == pytest.approx(0.5)  # the worst output (z) decides
    assert matrix["max_abs_error"][1][0] == pytest.approx(0.5) and matrix["max_abs_error"][0][0] == 0.0
    assert [row[2] for row in matrix["cosine"]] == [None] * 4 and matrix["sqnr_db"][0][3] is None
    assert [label["has_outputs"] for label in matrix["labels"]] == [True, True, False, True]
    assert matrix["labels"][3]["tier"] == "t3"
    with pytest.raises(ValueError, match="3 labels for 2"):
        cross_tier_matrix(labels[:3], [a, b])


def test_report_shows_top_ops_per_tier_and_what_changed_since_the_previous_artifact(filled, tmp_path):
    registry, made = filled
    report = build_drift_report(registry, "digits")
    shas = made["shas"]
    x86 = report["ops"]["x86-server"]
    assert [e["device_class"] for e in x86] == ["x86_64-cpu-onnxruntime"]
    entry = x86[0]
    assert entry["artifact_sha"] == shas["v2"] and entry["previous_short"] == report["artifacts"][1]["short"]
    assert entry["profile"]["top"] == [["Conv", 3.0], ["Relu", 0.2]]            # ms per call over 10 calls
    assert entry["changes"][0] == {"op": "Conv", "ms": 3.0, "previous_ms": 2.0, "change_ms": 1.0}
    assert report["ops"]["cortex-a"][0]["emulated"] is True
    html = render_html(report)
    assert 'id="table-ops-x86-server"' in html and "Conv +1" in html
    assert "peak memory (MiB)" in html and "load time (ms)" in html        # plots beside latency
    row = report["tiers"]["x86-server"]["rows"][2]
    assert row["metrics"]["peak_memory_mb"] == 80.0 and row["metrics"]["load_ms"] == 7.0


def test_report_command_prints_the_top_ops_per_tier_and_their_change(filled, tmp_path, capsys):
    from tiergate.cli.main import main

    code = main(["report", "--model", "digits", "--out", str(tmp_path / "out"),
                 "--registry", f"sqlite:///{tmp_path / 'registry.db'}", "--store", str(tmp_path / "store")])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("top ops")]
    assert len(lines) == 2 and any("x86-server / x86_64-cpu-onnxruntime @" in line for line in lines)
    assert all("Conv 3, Relu 0.2" in line and "Conv +1" in line for line in lines)
    assert any("cortex-a / arm64-cpu-onnxruntime (emulated)" in line for line in lines)
