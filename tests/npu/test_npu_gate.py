"""The NPU tier end to end, real containers: Vela 5.2.0 in its compiler image places the demo's digits models on an
Ethos-U55 (and an Ethos-U85), LiteRT's reference kernels compute the tier's outputs, and the gate decides through
the CLI with the NPU checks: the INT8 model is promoted, its float16 twin is rejected by min_npu_op_share with the
operators that fall back named, and the INT8 model with one operator forced to float is rejected by max_cpu_ops
while its accuracy equals the incumbent's, the diff naming the operator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tiergate.cli.main import main

TARGETS = Path(__file__).resolve().parents[2] / "targets"
pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _cli(capsys, monkeypatch, home, *args):
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    code = main([*args, "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def _checks(decision: dict, device_class: str) -> dict[str, dict]:
    return {c["name"]: c for c in decision["checks"] if c["device_class"] == device_class}


def test_int8_is_promoted_with_the_npu_checks_and_reference_kernels(npu_models, npu_home, capsys, monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, npu_home, "gate", "-c", str(npu_models["int8"]), "-r",
                          str(npu_models["fp32"]), "-d", str(npu_models["data"]), "-t",
                          "ethos-u55-128,x86_64-cpu-tflite")
    assert code == 0, err + out
    decision = json.loads(out)
    assert decision["verdict"] == "PROMOTE"
    npu = _checks(decision, "ethos-u55-128")
    # the tier is decided by its placement checks and its reference-kernel numeric checks; nothing timed
    assert npu["npu_op_share"]["passed"] and npu["npu_op_share"]["value"] == 1.0
    assert "6 of 6 operators on the NPU" in npu["npu_op_share"]["detail"]
    assert npu["cpu_ops"]["passed"] and npu["cpu_ops"]["value"] == 0
    assert npu["accuracy_ratio"]["passed"]
    assert not any(name.startswith("latency") or name in ("cost_per_1k",) for name in npu)
    metrics = decision["metrics"]["ethos-u55-128"]
    assert metrics["latency"] == {} and metrics["device"] == {}
    assert "reference kernels" in metrics["npu"]["numerics"]
    figures = metrics["npu"]["candidate"]
    assert figures["accelerator"] == "ethos-u55-128" and figures["vela_version"] == "5.2.0"
    assert figures["interface_ops"] == 2 and figures["cpu_ops"] == 0 and figures["npu_ops"] == 6
    assert 0 < figures["estimated_us"] < 1000 and figures["cycles"] > 0 and figures["sram_kib"] > 0
    assert figures["flash_kib"] > 0
    assert any("reference kernels" in n and "not a measurement of the NPU" in n for n in decision["notes"])
    # the runtime graph recorded with the decision: Vela's record, each operator's placement
    graph = decision["runtime"]["ethos-u55-128"]
    assert graph["runtime"] == "ethos-u" and graph["placement"] == {"cpu": 2, "npu": 6}
    ops = graph["npu"]["operators"]
    assert [op["op"] for op in ops if op["target"] == "CPU"] == ["QUANTIZE", "DEQUANTIZE"]
    assert all(op["interface"] for op in ops if op["target"] == "CPU")
    assert graph["npu"]["summary"]["cycles_total"] == figures["cycles"]
    # the tier's outputs are LiteRT's reference kernels: the same as a BUILTIN_REF interpreter on this host, and
    # not the XNNPACK tier's
    run = Path(decision["runs"]["candidate/ethos-u55-128"])
    result = json.loads((run / "result.json").read_text())
    assert result["extra"]["op_resolver"] == "BUILTIN_REF" and result["versions"]["ethos-u-vela"] == "5.2.0"
    tier = np.load(run / "outputs.npz")["probs"]
    xnnpack = np.load(Path(decision["runs"]["candidate/x86_64-cpu-tflite"]) / "outputs.npz")["probs"]
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    images = np.load(npu_models["data"])["image"]
    interp = Interpreter(model_path=str(npu_models["int8"]),
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [len(images), 8, 8, 1])
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], images)
    interp.invoke()
    assert np.array_equal(tier, interp.get_tensor(interp.get_output_details()[0]["index"]))
    assert not np.array_equal(tier, xnnpack)


def test_float16_candidate_is_rejected_by_npu_share_with_the_fallen_back_ops_named(npu_models, npu_home, capsys,
                                                                                   monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, npu_home, "gate", "-c", str(npu_models["fp16"]), "-r",
                          str(npu_models["fp32"]), "-d", str(npu_models["data"]), "-t", "ethos-u55-128")
    assert code == 1, err + out
    decision = json.loads(out)
    assert decision["verdict"] == "REJECT"
    share = _checks(decision, "ethos-u55-128")["npu_op_share"]
    assert not share["passed"] and share["value"] == 0.0
    for op in ("CONV_2D", "FULLY_CONNECTED", "SOFTMAX", "DEQUANTIZE"):
        assert op in share["detail"]
    assert "unsupported DataType Float32" in share["detail"]        # Vela's own reason
    assert _checks(decision, "ethos-u55-128")["accuracy_ratio"]["passed"]   # its numbers are fine: placement decides


def test_one_op_forced_to_float_is_rejected_by_max_cpu_ops_at_equal_accuracy(npu_models, npu_home, capsys,
                                                                             monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, npu_home, "gate", "-c", str(npu_models["softmax_float"]), "-r",
                          str(npu_models["fp32"]), "--incumbent", str(npu_models["int8"]), "-d",
                          str(npu_models["data"]), "-t", "ethos-u55-128")
    assert code == 1, err + out
    decision = json.loads(out)
    assert decision["verdict"] == "REJECT"
    checks = _checks(decision, "ethos-u55-128")
    failed = {name for name, c in checks.items() if not c["passed"]}
    assert failed == {"cpu_ops"}
    assert checks["cpu_ops"]["value"] == 2 and "operator #7 SOFTMAX" in checks["cpu_ops"]["detail"]
    assert checks["noninferior_accuracy"]["passed"]
    accuracy = decision["metrics"]["ethos-u55-128"]["accuracy"]
    assert accuracy["candidate"]["value"] == accuracy["incumbent"]["value"]
    diff = decision["metrics"]["ethos-u55-128"]["npu"]["diff"]
    assert len(diff["to_cpu"]) == 1 and diff["to_cpu"][0].startswith("operator #7 SOFTMAX (writes 'probs')")
    assert "on the NPU in the incumbent: operator #6 SOFTMAX" in diff["to_cpu"][0]
    assert diff["new_on_cpu"] == ["operator #6 DEQUANTIZE (writes 'logits_float'): Unsupported opType"]
    assert any("placement vs the incumbent: moved to the CPU: operator #7 SOFTMAX" in n for n in decision["notes"])
    # Vela's estimate alone would have let it through: the softmax's time on the CPU is not in it
    ratio = checks["estimated_time_ratio_vs_incumbent"]
    assert ratio["passed"] and ratio["value"] < 1 and "a lower bound" in ratio["detail"]
    # lint on the tier's runtime graph: one npu-fallback warning per operator that falls back, Vela's reason in it
    fallbacks = [f for f in decision["findings"]["ethos-u55-128"] if f["rule"] == "npu-fallback"]
    assert [f["nodes"] for f in fallbacks] == [[6], [7]] and all(f["severity"] == "warning" for f in fallbacks)
    assert "SOFTMAX" in fallbacks[1]["message"] and "unsupported DataType Float32" in fallbacks[1]["message"]


def test_inspect_target_json_on_both_npus_and_a_refused_config(npu_models, npu_home, tmp_path, capsys, monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, npu_home, "inspect", str(npu_models["softmax_float"]), "--target",
                          "ethos-u55-128,ethos-u85-256")
    assert code == 0, err + out
    report = json.loads(out)
    for name, accelerator in (("ethos-u55-128", "ethos-u55-128"), ("ethos-u85-256", "ethos-u85-256")):
        graph = report["runtime"][name]
        assert graph["ok"] and graph["npu"]["accelerator"] == accelerator
        cpu = [(op["index"], op["op"]) for op in graph["npu"]["operators"] if op["target"] == "CPU"
               and not op["interface"]]
        assert cpu == [(6, "DEQUANTIZE"), (7, "SOFTMAX")]
        assert graph["npu"]["summary"]["inference_time"] > 0
    # the compiler: Vela 5.2.0 in a content-tagged image (its lock's hash and Vela's version in its labels)
    import docker

    from tiergate.images import LABEL

    client = docker.from_env()
    images = client.images.list(filters={"label": f"{LABEL}.compiler=vela"})
    assert images and all(i.labels[f"{LABEL}.runtime.version"] == "5.2.0" for i in images)
    assert any(t.startswith("tiergate/vela-compiler:") and len(t.split(":")[1]) == 20 for i in images for t in i.tags)
    client.close()
    u55, u85 = (report["runtime"][n]["npu"]["summary"]["cycles_total"] for n in ("ethos-u55-128", "ethos-u85-256"))
    assert u55 != u85               # two accelerators, two estimates
    fallbacks = [f for f in report["findings"] if f["rule"] == "npu-fallback"]
    assert {(f["target"], f["nodes"][0]) for f in fallbacks} == {(n, i) for n in ("ethos-u55-128", "ethos-u85-256")
                                                                 for i in (6, 7)}
    # the same as a table (cli/npu_table.py; the runtime graph from the describe cache): each CPU fallback named
    assert main(["inspect", str(npu_models["softmax_float"]), "--target", "ethos-u55-128"]) == 0
    table = capsys.readouterr().out
    assert "SOFTMAX" in table and "DEQUANTIZE" in table and "operators on the NPU" in table.replace("\n", " ")
    # a system configuration Vela's file does not have: the tier's refusal in Vela's words, never a crash
    catalogue = tmp_path / "targets"
    catalogue.mkdir()
    text = (TARGETS / "ethos-u55-128.toml").read_text().replace("Ethos_U55_High_End_Embedded", "No_Such_System")
    (catalogue / "ethos-u55-128.toml").write_text(text)
    monkeypatch.setenv("TIERGATE_TARGETS_DIR", str(catalogue))
    code, out, err = _cli(capsys, monkeypatch, npu_home, "inspect", str(npu_models["int8"]), "--target",
                          "ethos-u55-128")
    assert code == 1, err + out
    graph = json.loads(out)["runtime"]["ethos-u55-128"]
    assert not graph["ok"] and "Vela cannot compile" in graph["error"] and "No_Such_System" in graph["error"]


def test_diff_target_names_the_operator_that_moved(npu_models, npu_home, capsys, monkeypatch):
    code, out, err = _cli(capsys, monkeypatch, npu_home, "diff", str(npu_models["int8"]),
                          str(npu_models["softmax_float"]), "--target", "ethos-u55-128")
    assert code == 1, err + out
    runtime = json.loads(out)["runtime"]["ethos-u55-128"]
    assert runtime["first_difference"] == "placement"
    moved = runtime["placement"]["to_cpu"]
    assert len(moved) == 1 and moved[0].startswith("operator #7 SOFTMAX (writes 'probs')")
    assert "on the NPU in the old model: operator #6 SOFTMAX" in moved[0]


def test_drift_report_shows_placement_and_estimate_over_versions(npu_models, npu_home, tmp_path, capsys,
                                                                 monkeypatch):
    monkeypatch.setenv("TIERGATE_HOME", str(npu_home))
    registry = f"sqlite:///{tmp_path / 'registry.db'}"

    def run(*args):
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out + err

    for name in ("int8", "softmax_float"):
        code, text = run("register", str(npu_models[name]), "--model", "digits", "--reference",
                         str(npu_models["fp32"]), "--registry", registry)
        assert code == 0, text
    common = ["-r", str(npu_models["fp32"]), "-d", str(npu_models["data"]), "-t", "ethos-u55-128",
              "--registry", registry]
    assert run("gate", "-c", str(npu_models["int8"]), *common)[0] == 0
    assert run("gate", "-c", str(npu_models["softmax_float"]), *common)[0] == 1
    code, text = run("report", "--model", "digits", "--out", str(tmp_path / "report"), "--registry", registry)
    assert code == 0, text
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    rows = {r["label"]: r for r in report["npu"]}
    assert (rows["v2"]["npu_op_share"], rows["v2"]["cpu_ops"]) == (1.0, 0)
    assert rows["v3"]["cpu_ops"] == 2 and rows["v3"]["npu_op_share"] == pytest.approx(5 / 7)
    assert rows["v3"]["estimated_us"] < rows["v2"]["estimated_us"]          # the fallback is not in the estimate
    assert any("SOFTMAX" in line for line in rows["v3"]["cpu"])
    cells = {r["label"]: r["cells"]["ethos-u55"] for r in report["verdicts"]["rows"]}
    assert cells["v3"]["failed"] == ["cpu_ops"] and cells["v3"]["npu"]["cpu_ops"] == 2
    html = (tmp_path / "report" / "report.html").read_text()
    assert 'id="table-npu"' in html and "NPU 71%, 2 on CPU, est. 22.2 us" in html
