"""TVM device classes without Docker: the catalogue's [compile] table, static shapes and the compile key, the compile
record read as a runtime graph (passes, their first difference), the decision's small pass summary, unsupported-op
on a compiling class, and the harness's TvmRunner against a stand-in `tvm` module (the real one runs in
test_tvm_gate.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tiergate import targets
from tiergate.errors import InputError
from tiergate.paths import containers_dir

TVM_CLASS = """tier = "t"
arch = "amd64"
runtime = "tvm"
runtime_version = "0.27.0.post1"
threads = 1
execution = "native"
cost_per_hour = 0.01
"""
COMPILE = '[compile]\ntarget = { kind = "llvm", mcpu = "x86-64-v3" }\n'


def test_shipped_tvm_classes():
    cat = targets.catalogue()
    x86, arm = cat["x86_64-cpu-tvm"], cat["arm64-cpu-tvm"]
    assert x86.compiled and arm.compiled and x86.artifact_format == arm.artifact_format == "onnx"
    assert x86.compile.target == {"kind": "llvm", "mcpu": "x86-64-v3"} and x86.compile.opt_level == 3
    assert arm.compile.target == {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76"}
    assert arm.emulated and arm.emulated_cpu == "cortex-a76" and not x86.emulated
    for dc in (x86, arm):     # static shapes: no batched calls; each library in its own image: no pairs
        assert dc.evaluation.batch == 0 and dc.evaluation.latency_pairs == 0
        assert dc.build.env == {"TVM_USE_RUNTIME_LIB": "1"} and dc.build.requirements_path.is_file()
    assert not cat["x86_64-cpu-onnxruntime"].compiled and cat["x86_64-cpu-onnxruntime"].compile is None


def test_evaluation_batch_defaults_to_single_calls_even_when_emulated(tmp_path):
    text = TVM_CLASS.replace('arch = "amd64"', 'arch = "arm64"').replace('"native"', '"emulated"')
    (tmp_path / "emu.toml").write_text(text + '[compile]\ntarget = { kind = "llvm", mtriple = "aarch64-linux-gnu" }\n')
    assert targets.catalogue(tmp_path)["emu"].evaluation.batch == 0


@pytest.mark.parametrize("text, field", [
    (TVM_CLASS, "compile.target"),
    (TVM_CLASS + "[compile]\nopt_level = 2\n", "compile.target"),
    (TVM_CLASS + COMPILE + "opt_level = 5\n", "compile.opt_level"),
    (TVM_CLASS + COMPILE + "level = 3\n", "compile.level"),
    (TVM_CLASS + '[compile]\ntarget = { kind = "cuda" }\n', "compile.target.kind"),
    (TVM_CLASS + '[compile]\ntarget = { kind = "llvm", device = "x" }\n', "compile.target.device"),
    (TVM_CLASS + '[compile]\ntarget = { kind = "llvm", mcpu = "has well" }\n', "compile.target.mcpu"),
    (TVM_CLASS + '[compile]\ntarget = { kind = "llvm", mattr = ["avx2"] }\n', "compile.target.mattr"),
    (TVM_CLASS + '[compile]\ntarget = "llvm -mcpu=haswell"\n', "compile.target"),
    (TVM_CLASS.replace('"amd64"', '"arm64"') + '[compile]\ntarget = { kind = "llvm", mcpu = "cortex-a76" }\n',
     "compile.target.mtriple"),
    (TVM_CLASS.replace('"amd64"', '"arm64"') + '[compile]\ntarget = { kind = "llvm", mtriple = "x86_64-linux-gnu" }\n',
     "compile.target.mtriple"),
    (TVM_CLASS + COMPILE + "[evaluation]\nbatch = 64\n", "evaluation.batch"),
    (TVM_CLASS.replace('runtime = "tvm"', 'runtime = "onnxruntime"').replace("0.27.0.post1", "1.31.1") + COMPILE,
     "compile"),
])
def test_bad_compile_tables_name_the_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        targets.load_device_class_file(path)
    assert f"field '{field}'" in err.value.message and str(path) in err.value.message
    assert "\n" not in err.value.one_line()


def _artifact(shape=("N", 3, 48, "W")):
    from tiergate.artifact.model import TensorSpec

    return types.SimpleNamespace(inputs=[TensorSpec("x", shape, "float32")], sha256="ab" * 32, path="m.onnx")


def test_static_shapes_come_from_the_data_else_the_model():
    from tiergate.build.tvm import static_shapes

    dc = targets.catalogue()["x86_64-cpu-tvm"]
    assert static_shapes(dc, _artifact(), {"x": [None, 3, 48, 192]}) == {"x": [1, 3, 48, 192]}
    assert static_shapes(dc, _artifact(("N", 3, 8, 8))) == {"x": [1, 3, 8, 8]}
    with pytest.raises(InputError, match=r"input 'x' \[N, 3, 48, W\].*evaluation data"):
        static_shapes(dc, _artifact())


def test_evaluation_data_give_one_calls_shapes(tmp_path):
    from tiergate.evaldata import load_eval_data
    from tiergate.artifact.model import TensorSpec

    np.savez(tmp_path / "d.npz", x=np.zeros((5, 3, 48, 192), np.float32), state=np.zeros((2, 5, 4), np.float32))
    inputs = [TensorSpec("x", ("N", 3, 48, "W"), "float32"), TensorSpec("state", (2, "N", 4), "float32")]
    data = load_eval_data(tmp_path / "d.npz", inputs, {"state": 1})
    assert data.call_shapes() == {"x": [None, 3, 48, 192], "state": [2, None, 4]}


def test_compile_key_changes_with_everything_that_changes_the_library():
    import dataclasses

    from tiergate.build.compiling import compile_key

    dc = targets.catalogue()["x86_64-cpu-tvm"]
    shapes = {"x": [1, 3, 8, 8]}
    base = compile_key(dc, "a" * 64, shapes, "tiergate/tvm-compiler:1")
    assert base == compile_key(dc, "a" * 64, {"x": [1, 3, 8, 8]}, "tiergate/tvm-compiler:1")
    others = [compile_key(dc, "b" * 64, shapes, "tiergate/tvm-compiler:1"),
              compile_key(dc, "a" * 64, {"x": [1, 3, 8, 9]}, "tiergate/tvm-compiler:1"),
              compile_key(dc, "a" * 64, shapes, "tiergate/tvm-compiler:2"),
              compile_key(dataclasses.replace(dc, disabled_passes=("FuseOps",)), "a" * 64, shapes,
                          "tiergate/tvm-compiler:1"),
              compile_key(dataclasses.replace(dc, compile=targets.CompileSpec(dc.compile.target, 2)), "a" * 64,
                          shapes, "tiergate/tvm-compiler:1"),
              compile_key(dataclasses.replace(dc, compile=targets.CompileSpec({"kind": "llvm"}, 3)), "a" * 64,
                          shapes, "tiergate/tvm-compiler:1")]
    assert len({base, *others}) == 7


PASSES = [{"name": "LegalizeOps", "fingerprint": "01"}, {"name": "FoldConstant", "fingerprint": "01"},
          {"name": "FuseOps", "fingerprint": "02"}, {"name": "FuseTIR", "fingerprint": "03"},
          {"name": "DeadCodeElimination", "fingerprint": "03"}]


def _record(passes, disabled=()):
    return {"tvm_version": "0.27.0.post1", "target": {"kind": "llvm"}, "opt_level": 3,
            "disabled_passes": list(disabled), "passes": passes, "compile_seconds": 1.5,
            "inputs": [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"}],
            "outputs": [{"name": "probs", "shape": [1, 3], "dtype": "float32"}]}


def test_a_compile_record_is_a_runtime_graph_with_its_passes(tmp_path):
    from tiergate.build.tvm import describe_doc
    from tiergate.decision import runtime_summary
    from tiergate.runtime_graph import changed_passes, first_difference, first_pass_difference, parse_describe

    def graph(passes, disabled=()):
        (tmp_path / "describe.json").write_text(json.dumps(describe_doc(_record(passes, disabled), "x86_64")))
        return parse_describe(tmp_path, target="x86_64-cpu-tvm", tier="t", runtime="tvm", emulated=False, image="i",
                              image_id="sha256:1", artifact_sha256="a" * 64)

    full = graph(PASSES)
    doc = full.to_json()
    assert doc["passes"] == PASSES and doc["compile"]["pass_count"] == 5 and doc["versions"] == {"tvm": "0.27.0.post1"}
    assert [p["name"] for p in changed_passes(PASSES)] == ["LegalizeOps", "FuseOps", "FuseTIR"]
    assert full.modified_by() == ["LegalizeOps", "FuseOps", "FuseTIR"]
    off = [PASSES[0], PASSES[1], {"name": "FuseTIR", "fingerprint": "05"}, {"name": "DeadCodeElimination",
                                                                            "fingerprint": "05"}]
    without = graph(off, disabled=["FuseOps"])
    assert without.disabled == ["FuseOps"]
    assert first_pass_difference(PASSES, off) == 2 == [p["name"] for p in PASSES].index("FuseOps")
    assert first_pass_difference(PASSES, PASSES) is None
    assert first_difference(full, without) == "pass FuseOps (#2)"
    summary = runtime_summary({"x86_64-cpu-tvm": doc})["x86_64-cpu-tvm"]["passes"]
    assert summary["count"] == 5 and summary["final"] == "03"
    assert summary["changed"] == [["LegalizeOps", "01"], ["FuseOps", "02"], ["FuseTIR", "03"]]


def test_unsupported_op_leaves_a_compiling_class_to_its_compile(tmp_path):
    import onnx

    from tiergate.artifact import load_artifact
    from tiergate.lint import lint
    from tiergate.runtime_graph import RuntimeGraph
    from tvmkit import tiny_net

    onnx.save(tiny_net(celu=True), tmp_path / "m.onnx")
    artifact = load_artifact(tmp_path / "m.onnx")
    dc = targets.catalogue()["x86_64-cpu-tvm"]
    assert not [f for f in lint(artifact, dc) if f.rule == "unsupported-op"]
    refused = RuntimeGraph(target=dc.name, tier=dc.tier, runtime="tvm", machine="x86_64", emulated=False, image="",
                           image_id="", artifact_sha256=artifact.sha256, ok=False,
                           error="x86_64-cpu-tvm: TVM cannot compile m.onnx: Celu is not supported",
                           versions={"tvm": "0.27.0.post1"})
    found = [f for f in lint(artifact, dc, runtime=refused) if f.rule == "unsupported-op"]
    assert len(found) == 1 and found[0].severity == "error" and "Celu is not supported" in found[0].message


# --- the harness's TvmRunner, against a stand-in tvm ---------------------------------------------------------------


def _fake_tvm(calls):
    """A `tvm` module with what TvmRunner uses: runtime.tensor, runtime.load_module, runtime.vm.VirtualMachine,
    cpu(). Its "library" returns (softmax-ish of the input's mean, the input's sum) as a tuple."""

    class Tensor:
        def __init__(self, array):
            self.array = array

        def numpy(self):
            return self.array

    def main(x):
        calls.append(x.array.shape)
        mean = x.array.reshape(len(x.array), -1).mean(axis=1, keepdims=True)
        return (Tensor(np.concatenate([mean, -mean], axis=1)), Tensor(x.array.reshape(len(x.array), -1).sum(1)))

    vm_module = types.SimpleNamespace(VirtualMachine=lambda lib, dev: {"main": main})
    runtime = types.SimpleNamespace(tensor=Tensor, load_module=lambda path: path, vm=vm_module)
    tvm = types.ModuleType("tvm")
    tvm.__version__, tvm.runtime, tvm.cpu = "0.27.0.post1", runtime, lambda: "cpu"
    return tvm, vm_module


def test_tvm_runner_runs_the_compiled_shapes_and_names_outputs_as_the_onnx_model(tmp_path, monkeypatch):
    calls = []
    tvm, vm_module = _fake_tvm(calls)
    monkeypatch.setitem(sys.modules, "tvm", tvm)
    monkeypatch.setitem(sys.modules, "tvm.runtime", tvm.runtime)
    monkeypatch.setitem(sys.modules, "tvm.runtime.vm", vm_module)
    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    spec = importlib.util.spec_from_file_location("harness_for_tvm", containers_dir() / "harness" /
                                                  "tiergate_harness.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    (tmp_path / "model.so").write_bytes(b"\x7fELF")
    record = _record(PASSES)
    record["outputs"] = [{"name": "probs", "shape": [1, 2], "dtype": "float32"},
                         {"name": "total", "shape": [1], "dtype": "float32"}]
    (tmp_path / "tvm-meta.json").write_text(json.dumps(record))
    x = np.random.default_rng(0).standard_normal((5, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    args = harness.parse_args(["--runtime", "tvm", "--model", str(tmp_path / "model.so"), "--data",
                               str(tmp_path / "d.npz"), "--out", str(tmp_path / "out"), "--eval-batch", "64",
                               "--latency-calls", "2", "--warmup", "1"])
    runner, batch, n, outputs, latencies = harness.run(args)
    assert (batch, n, len(latencies)) == (1, 5, 5)           # the compiled batch: no batched evaluation
    assert set(calls) == {(1, 3, 8, 8)} and runner.output_names == ["probs", "total"]
    assert runner.versions == {"tvm": "0.27.0.post1"} and runner.extra["tvm"]["passes"] == 5
    assert runner.extra["evaluation"]["batched"] is False
    mean = x.reshape(5, -1).mean(1)
    np.testing.assert_allclose(outputs["probs"][:, 0], mean, rtol=1e-6)
    np.testing.assert_allclose(outputs["total"], x.reshape(5, -1).sum(1), rtol=1e-5)
    assert harness.os.environ["TVM_NUM_THREADS"] == "1"
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 3, 8, 9), np.float32))
    with pytest.raises(SystemExit, match=r"not the compiled shape \[1, 3, 8, 8\]"):
        harness.run(harness.parse_args(["--runtime", "tvm", "--model", str(tmp_path / "model.so"), "--data",
                                        str(tmp_path / "bad.npz"), "--out", str(tmp_path / "o2")]))


def test_the_compile_script_and_locks_pin_one_tvm():
    """The compiler's lock and the runtime's lock render the same apache-tvm from the class's runtime_version."""
    from tiergate.build import render_lock

    dc = targets.catalogue()["x86_64-cpu-tvm"]
    runtime = render_lock(dc.build.requirements_path, dc)
    compiler = render_lock(containers_dir() / "tvm" / "requirements.txt", dc)
    pins = [line for line in runtime.splitlines() if line and not line.startswith("#")]
    assert f"apache-tvm=={dc.runtime_version}" in pins and all("==" in line for line in pins)
    assert set(pins) <= set(compiler.splitlines()) and "onnx==" in compiler
    assert Path(containers_dir() / "tvm" / "tiergate_tvm_compile.py").is_file()
