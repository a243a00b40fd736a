"""`tiergate inspect` and `tiergate diff`: exit codes, the JSON shape, and one clear line for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gatekit
from onnx import TensorProto

import modelkit as m
from tiergate.cli.main import main

TIERGATE = Path(sys.executable).parent / "tiergate"


def _run(capsys, *args):
    capsys.readouterr()  # drop what generating the models printed (the TFLite converter talks)
    code = main(list(map(str, args)))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_clean_model_exits_0_with_documented_json(capsys, tmp_path):
    path = m.save(m.conv_net(), "clean.onnx", tmp_path)
    code, out, _ = _run(capsys, "inspect", path, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] is True and doc["findings"] == []
    assert set(doc) == {"version", "artifact", "precision", "fingerprint", "target", "outputs", "findings", "summary",
                        "ok"}
    assert {name: kind["kind"] for name, kind in doc["outputs"].items()} == {
        spec["name"]: "map" for spec in doc["artifact"]["outputs"]}            # (N, C, 8, 8) at the input's size
    assert all(f["basis"] == "file" for f in doc["findings"])
    assert set(doc["artifact"]) == {"path", "format", "version", "sha256", "size_bytes", "inputs", "outputs",
                                    "node_count", "op_counts", "quantization", "external_data"}
    assert doc["artifact"]["inputs"] == [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"}]
    assert doc["artifact"]["op_counts"] == {"Conv": 3, "LeakyRelu": 1, "Relu": 1}
    assert set(doc["fingerprint"]) == {"structure", "weights", "quantization", "combined"}


def test_inspect_warnings_only_exits_0_and_prints_a_table(capsys, tmp_path):
    path = m.save(m.conv_net(batchnorm=True, identity=True), "seed.onnx", tmp_path)
    code, out, _ = _run(capsys, "inspect", path)
    assert code == 0
    assert "unfused-activation" in out and "unfolded-batchnorm" in out and "pass_inserted" in out
    assert "0 error(s), 2 warning(s)" in out


def test_inspect_error_findings_exit_1(capsys, tmp_path):
    path = m.save(m.unary_net("Det", TensorProto.DOUBLE), "det.onnx", tmp_path)
    code, out, _ = _run(capsys, "inspect", path, "--json", "--target", "x86_64-cpu-onnxruntime", "--no-runtime")
    doc = json.loads(out)
    assert code == 1 and doc["ok"] is False and doc["target"] == "x86_64-cpu-onnxruntime"
    assert doc["summary"]["error"] == 1 and doc["findings"][0]["rule"] == "unsupported-op"
    assert "NOT_IMPLEMENTED" in doc["findings"][0]["message"]  # the host onnxruntime's own refusal
    assert doc["runtime"] == {}


def test_inspect_several_files_is_one_call(capsys, tmp_path):
    """A corpus in one call: a JSON array (or one object per line), each file judged alone; the exit code is the
    worst of them, and an unusable file among several is reported without stopping the others."""
    clean = m.save(m.conv_net(), "clean.onnx", tmp_path)
    refused = m.save(m.unary_net("Det", TensorProto.DOUBLE), "det.onnx", tmp_path)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model at all")
    code, out, _ = _run(capsys, "inspect", clean, refused, "--json")
    docs = json.loads(out)
    assert code == 1 and [d["ok"] for d in docs] == [True, False]
    assert [d["artifact"]["path"] for d in docs] == [str(clean), str(refused)]
    code, out, _ = _run(capsys, "inspect", clean, junk, refused, "--jsonl")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 2 and [d["ok"] for d in lines] == [True, False, False]
    assert "error" in lines[1] and str(junk) in lines[1]["error"] and "findings" in lines[2]
    code, out, err = _run(capsys, "inspect", clean, junk)
    assert code == 2 and "3 files" not in out and "2 files: 1 ok, 0 with errors, 1 unusable" in out
    assert err.count("tiergate: error:") == 1 and "Traceback" not in err
    code, out, _ = _run(capsys, "inspect", clean, clean, "--json")
    assert code == 0 and len(json.loads(out)) == 2


def test_inspect_quantized_tflite_lists_quantization(capsys):
    path = m.save_tflite(m.tflite_activation_ranges(12 / 255, 0), "default.tflite")
    code, out, _ = _run(capsys, "inspect", path, "--json", "--target", "arm64-cpu-tflite", "--no-runtime")
    doc = json.loads(out)
    assert code == 1 and doc["artifact"]["format"] == "tflite"
    assert {q["dtype"] for q in doc["artifact"]["quantization"]} >= {"int8"}
    assert [f["rule"] for f in doc["findings"] if f["severity"] == "error"] == ["default-calibration-range"]


def test_diff_identical_exits_0_and_different_exits_1(capsys, tmp_path):
    a = m.save(m.conv_net(), "a.onnx", tmp_path)
    b = m.save(m.renamed(m.conv_net()), "b.onnx", tmp_path)
    c = m.save(m.conv_net(identity=True, alpha=0.2), "c.onnx", tmp_path)
    assert _run(capsys, "diff", a, b)[0] == 0
    code, out, _ = _run(capsys, "diff", a, c, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["identical"] is False
    assert doc["same"] == {"structure": False, "weights": True, "quantization": True}
    assert [n["op"] for n in doc["added"]] == ["Identity"]
    assert any(x["key"] == "alpha" for c in doc["changed"] for x in c["changes"])
    code, out, _ = _run(capsys, "diff", a, c)
    assert code == 1 and "added" in out and "Identity" in out and "alpha" in out


def _bad_inputs(tmp_path) -> dict[str, Path]:
    onnx_bytes = m.conv_net().SerializeToString()
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "truncated.onnx").write_bytes(onnx_bytes[: len(onnx_bytes) - 40])
    (tmp_path / "readme.txt").write_text("not a model\n")
    tflite = m.tflite_bytes("float")
    (tmp_path / "truncated.tflite").write_bytes(tflite[: len(tflite) // 2])
    escape = tmp_path / "art"
    escape.mkdir()
    import onnx

    model = m.conv_net()
    onnx.save(model, escape / "model.onnx", save_as_external_data=True, location="w.bin", size_threshold=0)
    saved = onnx.load(escape / "model.onnx", load_external_data=False)
    for t in saved.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                entry.value = "../../../etc/passwd"
    onnx.save(saved, escape / "model.onnx")
    return {"is empty": tmp_path / "empty.onnx", "truncated or corrupt": tmp_path / "truncated.onnx",
            "not an ONNX or TFLite model": tmp_path / "readme.txt",
            "TFLite file is truncated or corrupt": tmp_path / "truncated.tflite",
            "escapes the model's folder": escape / "model.onnx",
            "does not exist": tmp_path / "missing.onnx"}


def test_bad_input_exits_2_with_one_line(capsys, tmp_path):
    for problem, path in _bad_inputs(tmp_path).items():
        for argv in (["inspect", path], ["diff", path, path], ["inspect", path, "--json"]):
            code, out, err = _run(capsys, *argv)
            assert code == 2, (argv, err)
            assert err.count("\n") == 1 and err.startswith(f"tiergate: error: {path}: "), err
            assert problem in err and "Traceback" not in err and out == ""


def test_unknown_target_exits_2(capsys, tmp_path):
    code, _, err = _run(capsys, "inspect", m.save(m.conv_net(), "a.onnx", tmp_path), "--target", "no-such-class")
    assert code == 2 and "unknown device class" in err


def test_installed_entry_point(tmp_path):
    assert TIERGATE.exists(), f"{TIERGATE} is not installed (scripts/setup installs tiergate into .venv)"
    path = m.save(m.conv_net(batchnorm=True), "bn.onnx", tmp_path)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([str(TIERGATE), "inspect", str(path), "--json"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [f["rule"] for f in json.loads(done.stdout)["findings"]] == ["unfolded-batchnorm"]
    bad = subprocess.run([str(TIERGATE), "diff", str(path), str(tmp_path / "nope.onnx")], capture_output=True,
                         text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == f"tiergate: error: {tmp_path / 'nope.onnx'}: does not exist"


# ---------------------------------------------------------------- the runtime graph, in the tier's container

@pytest.fixture(scope="module")
def runtime_home(tmp_path_factory):
    """One TIERGATE_HOME for the module: the runtime-graph cache is shared between its tests."""
    with gatekit.home_at(tmp_path_factory.mktemp("tiergate-home")) as home:
        yield home


@pytest.mark.docker
@pytest.mark.slow
def test_inspect_target_judges_the_runtime_graph_and_caches_it(capsys, tmp_path, runtime_home):
    path = m.save(m.conv_net(batchnorm=True, identity=True), "seed.onnx", tmp_path)
    code, out, _ = _run(capsys, "inspect", path, "--json", "--target", "x86_64-cpu-onnxruntime")
    doc = json.loads(out)
    graph = doc["runtime"]["x86_64-cpu-onnxruntime"]
    assert code == 0 and graph["ok"] and graph["machine"] == "x86_64" and graph["cached"] is False
    assert set(graph["levels"]) == {"basic", "extended", "all"} and graph["default_level"] == "all"
    # onnxruntime folds the BatchNormalization, drops the Identity and fuses Conv+LeakyRelu
    assert graph["ops"]["basic"].get(":BatchNormalization", 0) == 0 and ":Identity" not in graph["ops"]["basic"]
    assert graph["ops"]["extended"]["com.microsoft:FusedConv"] >= 1
    assert set(graph["placement"]) == {"CPUExecutionProvider"}
    # the file-level rules would flag the seed's pattern; on this tier's runtime graph it is harmless
    assert not [f for f in doc["findings"] if f["rule"] in ("unfused-activation", "unfolded-batchnorm")]
    assert (runtime_home / "runtime-graphs").is_dir()
    code, out, _ = _run(capsys, "inspect", path, "--target", "x86_64-cpu-onnxruntime")
    assert code == 0 and "cached" in out and "(runs)" in out and "FusedConv" in out


@pytest.mark.docker
@pytest.mark.slow
def test_inspect_target_refused_artifact_names_the_runtime_message(capsys, tmp_path, runtime_home):
    path = m.save(m.unary_net("Det", TensorProto.DOUBLE), "det.onnx", tmp_path)
    code, out, err = _run(capsys, "inspect", path, "--json", "--target", "x86_64-cpu-onnxruntime")
    doc = json.loads(out)
    graph = doc["runtime"]["x86_64-cpu-onnxruntime"]
    assert code == 1 and graph["ok"] is False and "NOT_IMPLEMENTED" in graph["error"]
    (finding,) = [f for f in doc["findings"] if f["severity"] == "error"]
    assert finding["basis"] == "runtime" and finding["target"] == "x86_64-cpu-onnxruntime"
    assert "x86-server" in finding["message"] and "NOT_IMPLEMENTED" in finding["message"]
    assert "Traceback" not in out + err


@pytest.mark.docker
@pytest.mark.slow
def test_diff_target_names_the_first_level_that_differs(capsys, tmp_path, runtime_home):
    old = m.save(m.conv_net(batchnorm=True), "a.onnx", tmp_path)
    new = m.save(m.conv_net(batchnorm=True, identity=True), "b.onnx", tmp_path)
    code, out, _ = _run(capsys, "diff", old, new, "--json", "--target", "x86_64-cpu-onnxruntime")
    doc = json.loads(out)
    assert code == 1 and doc["same"]["structure"] is False  # the files differ (an Identity) ...
    rt = doc["runtime"]["x86_64-cpu-onnxruntime"]
    # ... but onnxruntime removes the Identity at its basic level: the runtime graphs are one
    assert rt["first_difference"] is None
    assert all(level["same"]["structure"] for level in rt["levels"].values())
    other = m.save(m.conv_net(batchnorm=True, alpha=0.3), "c.onnx", tmp_path)
    code, out, _ = _run(capsys, "diff", old, other, "--target", "x86_64-cpu-onnxruntime")
    assert code == 1 and "start to differ at level basic" in out


@pytest.mark.docker
def test_inspect_gpu_target_without_a_gpu_engine_says_file_only(capsys, tmp_path, runtime_home):
    import docker

    if "nvidia" in (docker.from_env().info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime: the GPU class is described for real")
    path = m.save(m.conv_net(), "gpu.onnx", tmp_path)
    code, out, _ = _run(capsys, "inspect", path, "--json", "--target", "cuda-gpu-onnxruntime")
    doc = json.loads(out)
    assert code == 0 and doc["runtime"] == {}
    (note,) = [f for f in doc["findings"] if f["rule"] == "runtime-graph"]
    assert note["severity"] == "warning" and note["target"] == "cuda-gpu-onnxruntime" and "NVIDIA" in note["message"]


def test_one_unusable_file_never_ends_a_multi_file_inspect(tmp_path):
    """Issue 42: /dev/zero ended the whole call ("internal error: MemoryError") and a FIFO hung it for ever; each
    unusable file is now its own record (regular files only are read), the others are inspected."""
    first, last = m.save(m.conv_net(), "first.onnx", tmp_path), m.save(m.mlp(), "last.onnx", tmp_path)
    os.mkfifo(tmp_path / "fifo.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "folder.onnx").mkdir()
    (tmp_path / "dangling.onnx").symlink_to(tmp_path / "nowhere.onnx")
    bad = ["/dev/zero", tmp_path / "fifo.onnx", tmp_path / "empty.onnx", tmp_path / "folder.onnx",
           tmp_path / "dangling.onnx"]
    proc = subprocess.run([str(TIERGATE), "inspect", str(first), *map(str, bad), str(last), "--json"],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TIERGATE_HOME=str(tmp_path / "home")))
    assert proc.returncode == 2, proc.stderr
    reports = json.loads(proc.stdout)
    assert [r["artifact"]["path"] for r in reports] == [str(first), *map(str, bad), str(last)]
    assert reports[0]["ok"] and reports[-1]["ok"]
    errors = [r["error"] for r in reports[1:-1]]
    assert "is a device, not a regular file" in errors[0] and "is a FIFO, not a regular file" in errors[1]
    assert "is empty" in errors[2] and "is a folder" in errors[3] and "no such file" in errors[4]
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
