"""The harness under the local process backend: no Docker, real onnxruntime and LiteRT."""

from __future__ import annotations

import json

import numpy as np
import pytest

import execution_kit as kit
from tiergate import results
from tiergate.errors import InputError
from tiergate.execution import Job, LocalProcessBackend, run_target, run_targets

ONNX_CLASS = "x86_64-cpu-onnxruntime"
TFLITE_CLASS = "x86_64-cpu-tflite"


def test_onnx_batches_and_matches_host(models, data, tmp_path):
    dc = kit.device_class(ONNX_CLASS, batch_size=4)
    result = run_target(dc, None, data, tmp_path, artifact_path=models["mlp"], artifact_sha256="a" * 64)
    assert result.ok, result.reason
    assert result.batch_size == 4 and result.n_samples == 10
    assert len(result.latencies_ns) == 3  # 4 + 4 + 2
    assert all(isinstance(x, int) and x > 0 for x in result.latencies_ns)
    assert result.machine == "x86_64" and not result.emulated
    assert result.versions["onnxruntime"] and result.versions["numpy"] == np.__version__
    assert result.data_sha256 == kit.sha256(data) and result.artifact_sha256 == "a" * 64
    saved = results.load(tmp_path)
    assert saved.latencies_ns == result.latencies_ns and saved.wall_s > 0
    np.testing.assert_allclose(results.load_outputs(tmp_path)["y"], kit.host_onnx(models["mlp"], data)["y"],
                               rtol=1e-6, atol=1e-6)


def test_fixed_batch_of_one_runs_per_sample(models, data, tmp_path):
    dc = kit.device_class(ONNX_CLASS, batch_size=4)
    result = run_target(dc, None, data, tmp_path, artifact_path=models["mlp_b1"], warmup=2)
    assert result.ok, result.reason
    assert result.batch_size == 1 and len(result.latencies_ns) == 10 and result.warmup == 2
    assert results.load_outputs(tmp_path)["y"].shape == (10, kit.N_OUT)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_tflite_matches_host_litert(tflite_models, tflite_data, tmp_path, kind):
    dc = kit.device_class(TFLITE_CLASS, batch_size=4)
    result = run_target(dc, None, tflite_data, tmp_path, artifact_path=tflite_models[kind])
    assert result.ok, result.reason
    assert len(result.latencies_ns) == 3 and result.versions["ai-edge-litert"]
    outputs = results.load_outputs(tmp_path)
    reference = kit.host_tflite(tflite_models[kind], tflite_data)
    assert set(outputs) == set(reference)
    for name, expected in reference.items():
        assert outputs[name].dtype == np.float32
        np.testing.assert_allclose(outputs[name], expected, rtol=1e-5, atol=1e-6)
    assert bool(result.extra["dequantized_outputs"]) == (kind == "int8")


def test_segfault_is_a_failed_result(models, data, tmp_path):
    result = run_target(ONNX_CLASS, None, data, tmp_path, artifact_path=models["mlp"],
                        env={"TIERGATE_HARNESS_FAULT": "segv"})
    assert not result.ok and result.reason == "crashed (segfault)"
    assert "Segmentation fault" in result.log_tail
    assert not (tmp_path / results.OUTPUTS_FILE).exists()
    assert json.loads((tmp_path / results.RESULT_FILE).read_text())["status"] == "failed"


def test_timeout_is_a_failed_result(models, data, tmp_path):
    dc = kit.device_class(ONNX_CLASS, timeout_s=2)
    result = run_target(dc, None, data, tmp_path, artifact_path=models["mlp"], env={"TIERGATE_HARNESS_FAULT": "hang"})
    assert not result.ok and result.reason == "timed out after 2 s"
    assert 2 <= result.wall_s < 20


def test_missing_input_array_names_it(models, tmp_path):
    bad = kit.eval_data(tmp_path / "bad.npz", name="not_x")
    result = run_target(ONNX_CLASS, None, bad, tmp_path / "out", artifact_path=models["mlp"])
    assert not result.ok
    assert "exited with code 1" in result.reason and "'x'" in result.reason


def test_missing_data_is_an_input_error(models, tmp_path):
    with pytest.raises(InputError, match="nope.npz: evaluation data does not exist"):
        run_target(ONNX_CLASS, None, tmp_path / "nope.npz", tmp_path / "out", artifact_path=models["mlp"])


def test_run_targets_keeps_good_results_next_to_failures(models, data, tmp_path):
    dc = kit.device_class(ONNX_CLASS)
    jobs = [Job(dc, data, tmp_path / "good", artifact_path=models["mlp"]),
            Job(dc, data, tmp_path / "crash", artifact_path=models["mlp"], env={"TIERGATE_HARNESS_FAULT": "segv"}),
            Job(dc, tmp_path / "missing.npz", tmp_path / "nodata", artifact_path=models["mlp"])]
    good, crash, nodata = run_targets(jobs, max_parallel=3)
    assert good.ok and results.load(tmp_path / "good").ok
    assert results.load_outputs(tmp_path / "good")["y"].shape == (10, kit.N_OUT)
    assert crash.reason == "crashed (segfault)" and results.load(tmp_path / "crash").reason == crash.reason
    assert "evaluation data does not exist" in nodata.reason


def test_local_backend_needs_an_artifact(data, tmp_path):
    with pytest.raises(InputError, match="needs the artifact"):
        LocalProcessBackend().run(Job(kit.device_class(ONNX_CLASS), data, tmp_path))


def test_compare_rounds_hook_records_harness_and_bare_medians(models, data, tmp_path):
    result = LocalProcessBackend().run(Job(kit.device_class(ONNX_CLASS), data, tmp_path, artifact_path=models["mlp"],
                                           compare_rounds=2))
    assert result.ok, result.reason
    rounds = result.extra["compare"]
    assert len(rounds) == 2
    for r in rounds:
        assert r["harness_median_ns"] > 0 and r["bare_median_ns"] > 0 and r["bare_loop_ns_per_call"] > 0
    assert len(result.latencies_ns) == 10  # the measured loop itself is unchanged by the hook


_LOADED_HOOKS = """
import os, runpy, sys
def _exit(code):                 # the harness leaves by os._exit (no teardown): here it returns, to list the modules
    raise SystemExit(code)
os._exit = _exit
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exc:
    assert not exc.code, exc.code
print("hook modules:", sorted(m for m in sys.modules if m.startswith("harness_")))
"""


def _hook_modules(*extra, models, data, tmp_path) -> str:
    import subprocess
    import sys

    from tiergate.paths import containers_dir

    harness = containers_dir() / "harness" / "tiergate_harness.py"
    args = ["--runtime", "onnxruntime", "--model", str(models["mlp"]), "--data", str(data), "--out", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-c", _LOADED_HOOKS, str(harness), *args, *extra],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()[-1]


# the core loop's own modules (tiergate_harness.py's docstring) and the CPU and memory readings: every run's
_EVERY_RUN = ["harness_after", "harness_batched", "harness_children", "harness_cpu", "harness_data", "harness_memory",
              "harness_output", "harness_runners"]


def test_hook_modules_are_imported_only_when_asked_for(models, data, tmp_path):
    from tiergate.paths import containers_dir

    # the other hooks come only with their option
    assert _hook_modules(models=models, data=data, tmp_path=tmp_path) == f"hook modules: {_EVERY_RUN}"
    assert _hook_modules("--compare-rounds", "1", models=models, data=data, tmp_path=tmp_path) == \
        f"hook modules: {sorted(_EVERY_RUN + ['harness_bench'])}"
    assert _hook_modules("--profile", models=models, data=data, tmp_path=tmp_path) == \
        f"hook modules: {sorted(_EVERY_RUN + ['harness_profile'])}"
    assert not (containers_dir() / "harness" / "__pycache__").exists()  # no byte-code left in the source tree


def test_unknown_fault_is_refused_by_name(models, data, tmp_path):
    result = run_target(ONNX_CLASS, None, data, tmp_path, artifact_path=models["mlp"],
                        env={"TIERGATE_HARNESS_FAULT": "explode"})
    assert not result.ok and "TIERGATE_HARNESS_FAULT='explode' is unknown" in result.reason


# --- interleaved calls with a partner (harness_paired.py: native latency ratios, docs/policy.md) -----------------
def test_a_paired_run_interleaves_its_calls_with_the_partner_and_changes_nothing_else(models, data, tmp_path):
    dc = kit.device_class(ONNX_CLASS, batch_size=1)
    plain = run_target(dc, None, data, tmp_path / "plain", artifact_path=models["mlp"])
    job = Job(dc, data, tmp_path / "paired", artifact_path=models["mlp"], pair_with=(models["mlp_v2"],), pairs=7,
              pair_sha256=("b" * 64,))
    (result,) = LocalProcessBackend().run_many([job])
    assert result.ok and plain.ok, (result.reason, plain.reason)
    paired = result.extra["paired"]
    (partner,) = paired["partners"]
    assert paired["pairs"] == 7 == len(paired["latencies_ns"]) == len(partner["latencies_ns"])
    assert partner["sha256"] == "b" * 64 and partner["model"].endswith("mlp_v2.onnx")
    assert all(x > 0 for x in paired["latencies_ns"] + partner["latencies_ns"])
    assert paired["feeds"] == 7 and paired["batch_size"] == 1        # 7 pairs over the first 7 samples
    # the run itself is the unpaired run's: every sample's outputs and a timed call each
    assert len(result.latencies_ns) == len(plain.latencies_ns) == 10
    np.testing.assert_array_equal(results.load_outputs(job.out_dir)["y"], results.load_outputs(tmp_path / "plain")["y"])
    assert "paired" not in plain.extra


def test_in_a_start_of_several_only_the_candidate_pairs_with_each_partner_and_a_failed_pairing_keeps_the_run(models, data,
                                                                                                 tmp_path):
    import modelkit as mk

    other_input = mk.write(mk.linear(np.ones((kit.N_FEATURES, kit.N_OUT), np.float32), input_name="other"),
                           tmp_path / "other.onnx")
    dc = kit.device_class(ONNX_CLASS, batch_size=1)
    jobs = [Job(dc, data, tmp_path / "c", artifact_path=models["mlp"], pair_with=(models["mlp_v2"], models["mlp_b1"]),
                pairs=5, pair_sha256=("r" * 64, "i" * 64)),
            Job(dc, data, tmp_path / "r", artifact_path=models["mlp_v2"])]
    candidate, reference = LocalProcessBackend().run_many(jobs)
    assert candidate.ok and reference.ok and "paired" not in reference.extra
    paired = candidate.extra["paired"]            # three models, five rounds, each round led by the next model
    assert paired["pairs"] == 5 and [p["sha256"] for p in paired["partners"]] == ["r" * 64, "i" * 64]
    assert all(len(p["latencies_ns"]) == 5 for p in paired["partners"])
    job = Job(dc, data, tmp_path / "bad", artifact_path=models["mlp"], pair_with=(other_input,), pairs=4)
    (result,) = LocalProcessBackend().run_many([job])
    assert result.ok and len(result.latencies_ns) == 10
    assert "no array named 'other'" in result.extra["paired"]["error"]


def test_a_partner_call_that_never_returns_cannot_hold_the_run(models, data, tmp_path):
    import time

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    body = helper.make_graph(          # a Loop of 2**63 - 1 MatMuls: never ends, whatever the CPU
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("MatMul", ["v_in", "w"], ["v_out"])],
        "forever", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                    helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["N", kit.N_FEATURES])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["N", kit.N_FEATURES])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body)], "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", kit.N_FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", kit.N_FEATURES])],
        [numpy_helper.from_array(np.array(2 ** 63 - 1, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go"),
         numpy_helper.from_array(np.eye(kit.N_FEATURES, dtype=np.float32), "w")])
    endless = tmp_path / "endless.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(endless))
    job = Job(kit.device_class(ONNX_CLASS, batch_size=1), data, tmp_path / "c", artifact_path=models["mlp"],
              pair_with=(endless,), pairs=4)
    started = time.monotonic()
    (result,) = LocalProcessBackend().run_many([job])
    took = time.monotonic() - started
    assert result.ok and len(result.latencies_ns) == 10, result.reason
    assert "loading and warming the partner took over 10 s" in result.extra["paired"]["error"]
    assert took < 60, took


# --- optimizer passes switched off (DeviceClass.disabled_passes: tiergate bisect, gate --disable-pass) -----------
def test_passes_switched_off_are_the_jobs_own_and_the_describe_shows_what_ran(models, data, tmp_path):
    import dataclasses

    dc = kit.device_class(ONNX_CLASS, batch_size=1)
    off = dataclasses.replace(dc, disabled_passes=("ConstantFolding", "MatMulAddFusion"))
    jobs = [Job(off, data, tmp_path / "c", artifact_path=models["mlp"], describe=True),
            Job(dc, data, tmp_path / "r", artifact_path=models["mlp"], describe=True)]
    candidate, reference = LocalProcessBackend().run_many(jobs)
    assert candidate.ok and reference.ok, (candidate.reason, reference.reason)
    assert candidate.extra["disabled_passes"] == ["ConstantFolding", "MatMulAddFusion"]
    assert "disabled_passes" not in reference.extra
    described = {name: json.loads((tmp_path / name / "describe.json").read_text()) for name in ("c", "r")}
    level = described["r"]["default_level"]
    ran = {name: [t[0] for t in doc["transformers"][level]] for name, doc in described.items()}
    assert described["c"]["disabled"] == ["ConstantFolding", "MatMulAddFusion"] and described["r"]["disabled"] == []
    assert "ConstantFolding" in ran["r"] and "ConstantFolding" not in ran["c"] and "MatMulAddFusion" not in ran["c"]
    assert all(len(t) == 3 and t[1] >= 1 and 0 <= t[2] <= t[1] for t in described["r"]["transformers"][level])
    np.testing.assert_allclose(results.load_outputs(tmp_path / "c")["y"], results.load_outputs(tmp_path / "r")["y"],
                               rtol=1e-5, atol=1e-6)


def test_litert_runs_without_xnnpack_when_it_is_switched_off_and_refuses_other_names(tflite_models, tflite_data,
                                                                                     tmp_path):
    import dataclasses

    dc = kit.device_class(TFLITE_CLASS, batch_size=1)
    plain = run_target(dc, None, tflite_data, tmp_path / "plain", artifact_path=tflite_models["fp32"])
    bare = run_target(dataclasses.replace(dc, disabled_passes=("XNNPACK",)), None, tflite_data, tmp_path / "bare",
                      artifact_path=tflite_models["fp32"])
    assert plain.ok and bare.ok, (plain.reason, bare.reason)
    assert bare.extra["disabled_passes"] == ["XNNPACK"]
    without, with_delegate = results.load_outputs(tmp_path / "bare"), results.load_outputs(tmp_path / "plain")
    assert set(without) == set(with_delegate)
    for name in without:
        np.testing.assert_allclose(without[name], with_delegate[name], rtol=1e-4, atol=1e-5)
    wrong = run_target(dataclasses.replace(dc, disabled_passes=("ConstantFolding",)), None, tflite_data,
                       tmp_path / "wrong", artifact_path=tflite_models["fp32"])
    assert not wrong.ok and "LiteRT has no pass named ConstantFolding" in wrong.reason
