"""The NPU tier without Docker: the Ethos-U classes' tables, the policy keys, the gate's NPU checks on saved runs
that carry Vela's records, the placement diff, lint's npu-fallback on a runtime graph, the decision's round trip and
the drift report's NPU rows. The records are written here in Vela's record's shape (containers/vela/
tiergate_vela_compile.py); test_npu_gate.py makes real ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tiergate import targets
from tiergate.errors import InputError
from tiergate.gate import Decision, RunOutcome, evaluate
from tiergate.policy import load_policy
from tiergate.results import TargetResult

U55 = """tier = "ethos-u55"
arch = "amd64"
runtime = "ethos-u"
runtime_version = "5.2.0"
threads = 1
execution = "native"
cost_per_hour = 0.0
[compile]
accelerator = "ethos-u55-128"
system_config = "Ethos_U55_High_End_Embedded"
memory_mode = "Shared_Sram"
[numerics]
litert_version = "2.3.0"
"""


def _class(tmp_path: Path, text: str, name: str = "npu") -> targets.DeviceClass:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return targets.load_device_class_file(path)


def test_shipped_classes_share_the_tflite_runtime_image():
    from tiergate.build import lock_versions, render_lock

    cat = targets.catalogue()
    u55, u85, tflite = cat["ethos-u55-128"], cat["ethos-u85-256"], cat["x86_64-cpu-tflite"]
    assert u55.compile.accelerator == "ethos-u55-128" and u85.compile.accelerator == "ethos-u85-256"
    assert u55.compile.memory_mode == "Shared_Sram" and u85.compile.system_config == "Ethos_U85_SYS_Flash_High"
    assert u55.runtime_version == "5.2.0" and u55.compiled and u55.artifact_format == "tflite"
    assert u55.image_runtime == "tflite" and u55.build.requirements == "tflite"
    lock = render_lock(u55.build.requirements_path, u55)
    assert "ai-edge-litert==2.3.0" in lock and lock == render_lock(tflite.build.requirements_path, tflite)
    assert lock_versions(lock, u55)["ai-edge-litert"] == "2.3.0"
    assert u55.evaluation.latency_pairs == 0
    vela_lock = (Path(targets.containers_dir()) / "vela" / "requirements.txt").read_text()
    assert "ethos-u-vela=={runtime_version}" in vela_lock


@pytest.mark.parametrize("change, field", [
    (('"ethos-u55-128"', '"ethos-u99-1"'), "compile.accelerator"),
    (('memory_mode = "Shared_Sram"\n', ''), "compile.memory_mode"),
    (('[numerics]\nlitert_version = "2.3.0"\n', ''), "numerics.litert_version"),
    (('memory_mode = "Shared_Sram"', 'memory_mode = "Shared_Sram"\ncores = 2'), "compile.cores"),
    (('system_config = "Ethos_U55_High_End_Embedded"', 'system_config = "a b"'), "compile.system_config"),
    (('litert_version = "2.3.0"', 'litert_version = "2.3.0"\nkernels = "xnnpack"'), "numerics.kernels"),
])
def test_bad_tables_are_one_line_naming_the_field(tmp_path, change, field):
    with pytest.raises(InputError) as err:
        _class(tmp_path, U55.replace(*change))
    assert f"field '{field}'" in str(err.value) and "npu.toml" in str(err.value)


def test_numerics_refused_on_another_runtime(tmp_path):
    text = U55.replace('runtime = "ethos-u"', 'runtime = "tflite"').replace("runtime_version = \"5.2.0\"",
                                                                        'runtime_version = "2.3.0"')
    text = text.split("[compile]")[0] + '[numerics]\nlitert_version = "2.3.0"\n'
    with pytest.raises(InputError, match="field 'numerics' applies to ethos-u classes"):
        _class(tmp_path, text)


def test_policy_keys(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[defaults]\nmax_cpu_ops = 1\nallowed_cpu_ops = ["softmax"]\n[override.ethos-u55]\n'
                      "max_npu_sram_kib = 0.5\nmin_npu_op_share = false\n")
    loaded = load_policy(policy)
    assert loaded.defaults.max_cpu_ops == 1 and loaded.defaults.allowed_cpu_ops == ("SOFTMAX",)
    dc = targets.catalogue()["ethos-u55-128"]
    assert loaded.for_target(dc).max_npu_sram_kib == 0.5 and loaded.for_target(dc).min_npu_op_share is None
    defaults = load_policy().defaults
    assert (defaults.min_npu_op_share, defaults.max_cpu_ops, defaults.max_estimated_time_ratio_vs_incumbent) == \
        (0.5, 0, 1.10)
    for bad in ("max_cpu_ops = -1", "max_cpu_ops = 0.5", 'allowed_cpu_ops = "SOFTMAX"', "min_npu_op_share = 1.5"):
        policy.write_text(f"[defaults]\n{bad}\n")
        with pytest.raises(InputError, match=bad.split(" ")[0]):
            load_policy(policy)


def _op(index, op, target, outputs, reason="", interface=False):
    return {"index": index, "op": op, "outputs": [outputs], "target": target, "reason": reason,
            "interface": interface}


def _record(ops, us, sram=1.25, flash=10.0):
    return {"vela_version": "5.2.0", "accelerator": "ethos-u55-128", "system_config": "S", "memory_mode": "M",
            "operators": ops, "summary": {"inference_time": us / 1e6 if us else 0.0, "cycles_total": us * 500,
                                          "core_clock": 5e8, "sram_memory_used": sram,
                                          "off_chip_flash_memory_used": flash, "on_chip_flash_memory_used": 0.0}}


INT8 = _record([_op(0, "QUANTIZE", "CPU", "q", "float input", True), _op(1, "CONV_2D", "NPU", "c"),
                _op(2, "SOFTMAX", "NPU", "s"), _op(3, "DEQUANTIZE", "CPU", "probs", "Unsupported opType", True)], 24.0)
FLOAT_SOFTMAX = _record([_op(0, "QUANTIZE", "CPU", "q", "float input", True), _op(1, "CONV_2D", "NPU", "c"),
                         _op(2, "DEQUANTIZE", "CPU", "f", "Unsupported opType"),
                         _op(3, "SOFTMAX", "CPU", "probs", "unsupported DataType Float32")], 22.0)
FP32 = _record([_op(0, "CONV_2D", "CPU", "c", "Float32"), _op(1, "SOFTMAX", "CPU", "probs", "Float32")], 0)


def _outcome(name, record, probs, sha):
    result = TargetResult(device_class=name, status="ok", latencies_ns=[1000] * len(probs), n_samples=len(probs),
                          extra={"npu": record}, artifact_sha256=sha)
    return RunOutcome(result, {"probs": probs})


def _decide(candidate, policy=None, incumbent=None):
    dc = targets.catalogue()["ethos-u55-128"]
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(10), 200).astype(np.float32)
    labels = probs.argmax(1)
    cand = {dc.name: _outcome(dc.name, candidate, probs, "c")}
    ref = {dc.name: _outcome(dc.name, FP32, probs, "r")}
    inc = {dc.name: _outcome(dc.name, incumbent, probs, "i")} if incumbent else None
    return evaluate(cand, ref, {dc.name: dc}, policy or load_policy(), labels, inc, quantized=True)


def _by_name(decision):
    return {c.name: c for c in decision.checks}


def test_npu_checks_decide_and_name_the_fallback():
    decision = _decide(FLOAT_SOFTMAX, incumbent=INT8)
    checks = _by_name(decision)
    assert decision.verdict == "REJECT" and not checks["cpu_ops"].passed and checks["cpu_ops"].value == 2
    assert "operator #3 SOFTMAX (writes 'probs'): unsupported DataType Float32" in checks["cpu_ops"].detail
    assert not checks["npu_op_share"].passed and checks["npu_op_share"].value == pytest.approx(1 / 3)
    assert "latency_ratio" not in checks and "noninferior_latency" not in checks
    ratio = checks["estimated_time_ratio_vs_incumbent"]
    assert ratio.value == pytest.approx(22 / 24) and "a lower bound" in ratio.detail
    diff = decision.metrics["ethos-u55-128"].npu["diff"]
    assert diff["to_cpu"][0].startswith("operator #3 SOFTMAX") and "operator #2 SOFTMAX" in diff["to_cpu"][0]
    assert diff["new_on_cpu"] == ["operator #2 DEQUANTIZE (writes 'f'): Unsupported opType"]
    # the FP32 reference has no NPU work: the ratio to it is not applied, and the decision says so
    assert "estimated_time_ratio" not in checks
    # round trip: the NPU figures and the thresholds' operator list come back as they were
    again = Decision.from_json(json.loads(json.dumps(decision.to_json())))
    assert again.metrics["ethos-u55-128"].npu == decision.metrics["ethos-u55-128"].npu
    assert again.metrics["ethos-u55-128"].thresholds == decision.metrics["ethos-u55-128"].thresholds


def test_allowed_ops_budgets_and_the_reference_ratio(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text('[defaults]\nallowed_cpu_ops = ["SOFTMAX", "DEQUANTIZE"]\nmax_npu_sram_kib = 1.0\n'
                      "max_npu_flash_kib = 64.0\nmax_estimated_time_ratio = 1.0\n")
    checks = _by_name(_decide(FLOAT_SOFTMAX, load_policy(policy)))
    assert checks["cpu_ops"].passed and checks["cpu_ops"].value == 0 and "not counted" in checks["cpu_ops"].detail
    assert not checks["npu_sram_kib"].passed and checks["npu_sram_kib"].value == 1.25
    assert checks["npu_flash_kib"].passed
    decision = _decide(FLOAT_SOFTMAX, load_policy(policy))
    assert "estimated_time_ratio" not in _by_name(decision)
    assert any("estimated_time_ratio not applied: the FP32 reference has no NPU work" in n for n in decision.notes)


def test_a_run_without_vela_record_fails_the_tier():
    dc = targets.catalogue()["ethos-u55-128"]
    probs = np.full((30, 10), 0.1, dtype=np.float32)
    bare = RunOutcome(TargetResult(device_class=dc.name, status="ok", n_samples=30), {"probs": probs})
    decision = evaluate({dc.name: bare}, {dc.name: bare}, {dc.name: dc}, load_policy(), None)
    assert decision.verdict == "REJECT" and not _by_name(decision)["npu_placement"].passed


def test_npu_fallback_lint_on_the_runtime_graph(tmp_path):
    import modelkit as mk
    from tiergate.artifact import load_artifact
    from tiergate.lint import lint
    from tiergate.runtime_graph import from_describe
    from tiergate.build.vela import describe_doc

    path = mk.save_tflite(mk.tflite_bytes("int8"), "npu-lint.tflite", tmp_path)
    artifact = load_artifact(path)
    dc = targets.catalogue()["ethos-u55-128"]
    ops = [_op(n.index, n.op, "CPU" if n.index == len(artifact.nodes) - 1 else "NPU", n.outputs[0],
               "Unsupported opType" if n.index == len(artifact.nodes) - 1 else "") for n in artifact.nodes]
    graph = from_describe(describe_doc(_record(ops, 10.0)), None, target=dc.name, tier=dc.tier, runtime=dc.runtime,
                          emulated=False, image="", image_id="", artifact_sha256=artifact.sha256)
    assert graph.placement == {"npu": len(ops) - 1, "cpu": 1}
    found = [f for f in lint(artifact, dc, runtime=graph) if f.rule == "npu-fallback"]
    assert len(found) == 1 and found[0].nodes == (len(ops) - 1,) and "Unsupported opType" in found[0].message
    assert found[0].basis == "runtime" and found[0].target == dc.name
    assert not [f for f in lint(artifact, dc, runtime=graph) if f.rule == "unsupported-op"]


def test_report_rows_and_the_verdict_cell():
    from tiergate.decision import runtime_summary
    from tiergate.registry.report_data import npu_over_versions, verdict_matrix
    from tiergate.reports.html import npu_table, verdict_table

    summary = runtime_summary({"ethos-u55-128": {"ok": True, "tier": "ethos-u55", "runtime": "ethos-u",
                                                 "npu": FLOAT_SOFTMAX, "ops": {}, "placement": {}}})
    npu = summary["ethos-u55-128"]["npu"]
    assert npu["tier"] == "ethos-u55" and npu["cpu_ops"] == 2 and npu["estimated_us"] == pytest.approx(22.0)
    artifacts = [{"sha256": "a" * 64, "label": "v1", "family": "f", "short": "aaaa", "registered_at": "2026-11-27"}]
    decisions = [{"id": 1, "artifact_sha": "a" * 64, "verdict": "REJECT", "tiers": ["ethos-u55"], "checks": [],
                  "explained": False, "npu": {"ethos-u55-128": npu}}]
    rows = npu_over_versions(artifacts, decisions)
    assert rows[0]["npu_op_share"] == pytest.approx(1 / 3) and rows[0]["cpu_ops"] == 2
    html = npu_table(rows)
    assert "table-npu" in html and "33% (1 of 3)" in html and "22.0" in html and "SOFTMAX" in html
    matrix = verdict_matrix(artifacts, decisions, ["ethos-u55"])
    cell = matrix["rows"][0]["cells"]["ethos-u55"]
    assert cell["npu"]["cpu_ops"] == 2
    assert "NPU 33%, 2 on CPU, est. 22.0 us" in verdict_table({"verdicts": matrix, "artifacts": artifacts})
