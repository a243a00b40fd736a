"""The drift report's data and page, from a registry filled with real runs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from report_kit import T0

from tiergate.cli.main import main
from tiergate.registry import METRIC_KEYS, Registry, flat_metrics
from tiergate.registry.report_data import build_drift_report, report_metrics
from tiergate.reports.drift import cross_tier_matrix
from tiergate.reports.html import render_html, write_report
from tiergate.targets import resolve


def _stored(folder):
    """What a run left: its outputs and its result.json (the only source of truth for the expectations)."""
    with np.load(folder / "outputs.npz") as npz:
        outputs = {k: npz[k] for k in npz.files}
    return outputs, json.loads((folder / "result.json").read_text())


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_rows_per_tier_follow_the_registry(filled):
    registry, made = filled
    report = build_drift_report(registry, "digits")
    shas, runs = made["shas"], made["runs"]
    assert [runs[n]["verdict"] for n in ("fp32", "v1", "v2")] == ["PROMOTE", "REJECT", "PROMOTE"]
    assert [a["sha256"] for a in report["artifacts"]] == [shas["fp32"], shas["v1"], shas["v2"]]
    assert sorted(report["tiers"]) == ["cortex-a", "x86-server"]
    assert report["promoted"] == {"cortex-a": shas["v2"], "x86-server": shas["v2"]}
    rows = report["tiers"]["cortex-a"]["rows"]
    assert [r["artifact_sha"] for r in rows] == [shas["fp32"], shas["v1"], shas["v2"]]
    assert [r["decision"] for r in rows] == ["promote", "reject", "promote"]
    assert [r["promoted"] for r in rows] == [False, False, True]
    assert all(r["emulated"] and r["machine"] == "aarch64" for r in rows)      # really run as arm64
    assert all(r["machine"] == "x86_64" and not r["emulated"] for r in report["tiers"]["x86-server"]["rows"])
    x86_v1 = report["tiers"]["x86-server"]["rows"][1]
    outputs, result = _stored(runs["v1"]["x86_64-cpu-onnxruntime"])
    assert x86_v1["metrics"]["accuracy"] == pytest.approx(np.mean(outputs["y"].argmax(1) == made["labels"]))
    mean_ms = np.mean(result["latencies_ns"]) / 1e6
    price = resolve(["x86_64-cpu-onnxruntime"])[0].cost_per_hour
    assert x86_v1["metrics"]["cost_per_1k"] == pytest.approx(price * mean_ms / 3600.0, rel=1e-9)
    assert x86_v1["metrics"]["latency_p50_ms"] == pytest.approx(np.percentile(result["latencies_ns"], 50) / 1e6)
    assert report["tiers"]["cortex-a"]["rows"][1]["metrics"]["cost_per_1k"] is None    # never from emulation
    assert any("accuracy_ratio" in r for r in x86_v1["reasons"]) and x86_v1["cost_tags"] == {"billing": "edge-fleet"}


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_cross_tier_matrix_is_computed_from_the_stored_outputs(filled):
    registry, made = filled
    cross = build_drift_report(registry, "digits")["cross_tier"]
    assert [(c["tier"], c["device_class"]) for c in cross["labels"]] == [
        ("cortex-a", "arm64-cpu-onnxruntime"), ("x86-server", "x86_64-cpu-onnxruntime")]
    arm = _stored(made["runs"]["v2"]["arm64-cpu-onnxruntime"])[0]["y"].astype(np.float64)
    x86 = _stored(made["runs"]["v2"]["x86_64-cpu-onnxruntime"])[0]["y"].astype(np.float64)
    expected = float(np.max(np.abs(arm - x86)))
    assert expected < 1e-4                                    # the same FP32 math on two architectures
    assert cross["max_abs_error"][0][1] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert cross["max_abs_error"][1][0] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert cross["max_abs_error"][0][0] == 0.0 and cross["cosine"][1][1] == pytest.approx(1.0)
    cos = np.sum(arm * x86, axis=1) / (np.linalg.norm(arm, axis=1) * np.linalg.norm(x86, axis=1))
    assert cross["cosine"][0][1] == pytest.approx(float(cos.mean()), rel=1e-12)


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_since_keeps_later_artifacts_only(filled):
    registry, made = filled
    report = build_drift_report(registry, "digits", since=T0.replace(day=2))
    assert [a["sha256"] for a in report["artifacts"]] == [made["shas"]["v1"], made["shas"]["v2"]]
    assert all(len(t["rows"]) == 2 for t in report["tiers"].values())
    assert report["since"].startswith("2026-03-02")


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_html_works_offline_with_one_plot_per_tier_and_a_page_per_decision(filled, tmp_path):
    registry, made = filled
    report = build_drift_report(registry, "digits")
    html_path, json_path = write_report(report, tmp_path / "out")
    page = html_path.read_text()
    for plot_id in ("plot-tier-cortex-a", "plot-tier-x86-server", "plot-cross-tier"):
        assert len(re.findall(f'<div id="{plot_id}"', page)) == 1
    assert "arm64-cpu-onnxruntime (emulated)" in page
    assert page.count('id="table-tier-') == 2 and 'id="table-cross-tier"' in page and 'id="table-verdicts"' in page
    # plotly.js is loaded once, from the file beside the page; nothing is fetched from anywhere else
    assert re.findall(r"<script src=\"([^\"]+)\"", page) == ["plotly.min.js"]
    assert (tmp_path / "out" / "plotly.min.js").stat().st_size > 1_000_000
    assert not re.search(r"(src|href)=\"(https?:|//)", page)
    assert json.loads(json_path.read_text())["promoted"] == report["promoted"]
    assert report["generated_at"] in page
    ids = sorted(d["id"] for d in report["decisions"])
    pages = sorted(p.name for p in (tmp_path / "out" / "decisions").iterdir())
    assert pages == sorted([f"decision-{i}.html" for i in ids] + [f"explain-{made['runs']['v1']['decision_id']}.html"])
    for i in ids:
        assert f'href="decisions/decision-{i}.html"' in page


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_versions_families_decisions_and_the_verdict_matrix(filled):
    registry, made = filled
    report = build_drift_report(registry, "digits")
    shas, runs = made["shas"], made["runs"]
    assert [(a["label"], a["version_source"], a["family"]) for a in report["artifacts"]] == [
        ("v1", "ordinal", "fp32/onnx"), ("v2", "ordinal", "int8/onnx"), ("v3", "ordinal", "int8/onnx")]
    assert [r["label"] for r in report["tiers"]["x86-server"]["rows"]] == ["v1", "v2", "v3"]
    recorded = {d.id: d for sha in shas.values() for d in registry.decisions(artifact_sha=sha)}
    assert sorted(d["id"] for d in report["decisions"]) == sorted(recorded)
    rejected = next(d for d in report["decisions"] if d["id"] == runs["v1"]["decision_id"])
    assert rejected["verdict"] == "reject" and rejected["explained"] and rejected["artifact_sha"] == shas["v1"]
    failed = {c.label for c in recorded[rejected["id"]].checks if not c.passed}
    assert failed and {c["label"] for c in rejected["checks"] if c["outcome"] == "fail"} == failed
    assert [a["sha256"] for a in rejected["lineage"]] == [shas["v1"], shas["fp32"]]
    assert rejected["reference"]["sha256"] == shas["fp32"]
    matrix = report["verdicts"]
    assert matrix["tiers"] == ["cortex-a", "x86-server"]
    assert [[row["cells"][t]["verdict"] for t in matrix["tiers"]] for row in matrix["rows"]] == [
        ["promote"] * 2, ["reject"] * 2, ["promote"] * 2]
    cell = matrix["rows"][1]["cells"]["x86-server"]
    assert cell["decision_id"] == rejected["id"] and cell["explained"]
    assert set(cell["failed"]) == {c.label for c in recorded[rejected["id"]].checks
                                   if not c.passed and c.tier == "x86-server" and not c.inconclusive}
    assert report["explanations"] == {str(rejected["id"]): made["explained"].to_json()}
    assert set(report["explanations"]) == {str(d["id"]) for d in report["decisions"] if d["explained"]}


def test_version_is_the_tag_then_the_mlflow_version_then_the_ordinal():
    from datetime import datetime, timezone

    from tiergate.registry.records import ArtifactRecord
    from tiergate.registry.report_data import artifact_entries, family_of, version_of

    def artifact(n: int, tags: dict, precision="int8") -> ArtifactRecord:
        return ArtifactRecord(sha256=f"{n:x}" * 64, model="m", format="onnx", precision=precision, fingerprint={},
                              parent_sha=None, reference_sha=None, config_sha=None, tags=tags, filename="m.onnx",
                              size_bytes=1, store_key="k", registered_at=datetime(2026, 1, n, tzinfo=timezone.utc))

    tagged = artifact(1, {"version": "1.4", "mlflow.version": "7"})
    mlflow = artifact(2, {"mlflow.version": "7", "mlflow.name": "digits"})
    plain, again = artifact(3, {}), artifact(4, {"version": "1.4"})
    fp32 = artifact(5, {"version": "1.4", "family": "baseline"}, precision="fp32")
    assert version_of(tagged, 1) == ("1.4", "tag") and version_of(mlflow, 2) == ("mlflow v7", "mlflow")
    assert version_of(plain, 3) == ("v3", "ordinal") and version_of(artifact(6, {"version": " "}), 6)[0] == "v6"
    assert family_of(plain) == "int8/onnx" and family_of(fp32) == "baseline"
    entries = artifact_entries([tagged, mlflow, plain, again, fp32], [mlflow, plain, again, fp32])
    assert [e["ordinal"] for e in entries] == [2, 3, 4, 5]            # ordinals over the model, not the shown part
    # a version repeated within one family is told apart by its hash; another family may share it
    assert [e["label"] for e in entries] == ["mlflow v7", "v3", "1.4", "1.4"]
    entries = artifact_entries([tagged, again], [tagged, again])
    assert [e["label"] for e in entries] == ["1.4", f"1.4 ({again.short[:6]})"]


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
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


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
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
                                        "artifact_mb": None, "instructions_per_inference": None}
    figures = {"device": {"candidate": {"peak_memory_bytes": 3 * 1024 * 1024, "load_ms": 4.5,
                                        "first_inference_ms": 0.5, "artifact_bytes": 1024 * 1024,
                                        "instructions_per_inference": 4.8e7}}}
    flat = flat_metrics(figures)
    assert (flat["peak_memory_mb"], flat["load_ms"], flat["first_inference_ms"], flat["artifact_mb"],
            flat["instructions_per_inference"]) == (3.0, 4.5, 0.5, 1.0, 4.8e7)
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


def _recorded_profile(registry, sha, device_class):
    """ms per call by op type, from the op profile the gate recorded for this artifact (gate --profile)."""
    detail = registry.decisions(artifact_sha=sha)[-1].detail
    profile = detail["metrics"][device_class]["device"]["candidate"]["op_profile"]
    return {op: t["total_ms"] / max(int(profile["calls"]), 1) for op, t in profile["by_op_type"].items()}


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_report_shows_top_ops_per_tier_and_what_changed_since_the_previous_artifact(filled, tmp_path):
    registry, made = filled
    report = build_drift_report(registry, "digits")
    shas = made["shas"]
    x86 = report["ops"]["x86-server"]
    assert [e["device_class"] for e in x86] == ["x86_64-cpu-onnxruntime"]
    entry = x86[0]
    assert entry["artifact_sha"] == shas["v2"] and entry["previous_short"] == report["artifacts"][1]["short"]
    now = _recorded_profile(registry, shas["v2"], "x86_64-cpu-onnxruntime")
    before = _recorded_profile(registry, shas["v1"], "x86_64-cpu-onnxruntime")
    assert now and set(now) <= {"MatMul", "Add", "Gemm", "FusedGemm"}      # the tiny model (optimized) ops
    assert [op for op, _ in entry["profile"]["top"]] == sorted(now, key=lambda op: -now[op])[:5]
    assert all(ms == pytest.approx(now[op]) for op, ms in entry["profile"]["top"])
    biggest = max(set(now) | set(before), key=lambda op: abs(now.get(op, 0.0) - before.get(op, 0.0)))
    assert entry["changes"][0]["op"] == biggest
    assert entry["changes"][0]["change_ms"] == pytest.approx(now.get(biggest, 0.0) - before.get(biggest, 0.0))
    assert report["ops"]["cortex-a"][0]["emulated"] is True
    html = render_html(report)
    assert 'id="table-ops-x86-server"' in html
    assert "peak memory (MiB)" in html and "load time (ms)" in html        # plots beside latency
    row = report["tiers"]["x86-server"]["rows"][2]
    figures = registry.decisions(artifact_sha=shas["v2"])[-1].detail["metrics"]["x86_64-cpu-onnxruntime"]
    device = figures["device"]["candidate"]
    assert row["metrics"]["peak_memory_mb"] == pytest.approx(device["peak_memory_bytes"] / 2**20)
    assert row["metrics"]["load_ms"] == pytest.approx(device["load_ms"])


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_report_command_prints_the_top_ops_per_tier_and_their_change(filled, tmp_path, capsys):
    from tiergate.cli.main import main

    registry, made = filled
    code = main(["report", "--model", "digits", "--out", str(tmp_path / "out"),
                 "--registry", registry.url, "--store", registry.store.location])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("top ops")]
    assert len(lines) == 2 and any("x86-server / x86_64-cpu-onnxruntime @" in line for line in lines)
    assert any("cortex-a / arm64-cpu-onnxruntime (emulated)" in line for line in lines)
    top = max(_recorded_profile(registry, made["shas"]["v2"], "x86_64-cpu-onnxruntime").items(), key=lambda kv: kv[1])
    assert any(top[0] in line for line in lines)

@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
@pytest.mark.counting
def test_report_shows_instructions_per_inference_over_time_on_the_emulated_tier(filled, tmp_path, capsys):
    """Counted on the emulated arm64 class (the counting QEMU): each artifact's instructions per call in the
    report's rows, its HTML columns, and `tiergate report`'s lines; the native class has none."""
    from tiergate.cli.main import main

    registry, made = filled
    code = main(["report", "--model", "digits", "--out", str(tmp_path / "out"),
                 "--registry", registry.url, "--store", registry.store.location])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("instructions/call")]
    assert len(lines) == 3 and all("cortex-a / arm64-cpu-onnxruntime @" in line for line in lines), out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    arm = [row["metrics"]["instructions_per_inference"] for row in report["tiers"]["cortex-a"]["rows"]]
    x86 = [row["metrics"]["instructions_per_inference"] for row in report["tiers"]["x86-server"]["rows"]]
    assert len(arm) == 3 and all(v and v > 0 for v in arm) and x86 == [None] * len(x86)
    assert "instr/call" in (tmp_path / "out" / "report.html").read_text()
