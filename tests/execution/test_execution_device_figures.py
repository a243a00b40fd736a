"""The device figures every run reports (load, cold first call, peak memory and its shares, size, op profile).

Local process runs (no Docker) check the harness's own readings against what the models are known
to need; container runs check that every figure arrives on native x86_64 and on emulated arm64.
"""

from __future__ import annotations

import pytest

import execution_kit as kit
from tiergate import results
from tiergate.execution import Job, execute, run_target

ONNX_CLASS = "x86_64-cpu-onnxruntime"
MiB = 1024 * 1024


def _figures_complete(fig, artifact_bytes: int | None = None):
    assert fig is not None, "no device figures"
    assert fig.load_ms > 0 and fig.first_inference_ms > 0
    assert fig.peak_memory_bytes >= fig.baseline_memory_bytes > 10 * MiB   # Python + numpy + runtime
    assert fig.peak_memory_bytes >= fig.baseline_memory_bytes + fig.load_memory_bytes
    assert fig.load_memory_bytes >= 0 and fig.inference_memory_bytes >= 0
    assert "VmHWM" in fig.memory_source
    if artifact_bytes is not None:
        assert fig.artifact_bytes == artifact_bytes


def test_local_run_reports_every_figure_and_round_trips(models, data, tmp_path):
    result = run_target(ONNX_CLASS, None, data, tmp_path, artifact_path=models["mlp"])
    assert result.ok, result.reason
    _figures_complete(result.device, models["mlp"].stat().st_size)
    assert result.device.cgroup_peak_bytes is None      # a local process has no cgroup of its own
    assert result.device.op_profile is None              # only with --profile
    assert results.load(tmp_path) == result


def test_memory_shares_hold_what_the_model_allocates(models, data, tmp_path):
    """memory_hungry's file is tiny, but it needs two 128 MiB tensors: onnxruntime folds them at load
    (constant folding), so the kernel's figures put them in the load share, not the inference share."""
    small = run_target(ONNX_CLASS, None, data, tmp_path / "small", artifact_path=models["mlp"])
    result = run_target(ONNX_CLASS, None, data, tmp_path / "hungry", artifact_path=models["hungry"])
    assert result.ok and small.ok, result.reason
    fig = result.device
    assert fig.artifact_bytes < 4096
    assert fig.load_memory_bytes >= 128 * MiB, fig
    assert fig.load_memory_bytes > small.device.load_memory_bytes + 100 * MiB
    assert fig.inference_memory_bytes < 64 * MiB, fig
    assert fig.peak_memory_bytes >= fig.baseline_memory_bytes + 128 * MiB
    assert fig.load_ms > small.device.load_ms


def test_profile_sums_time_per_op_type_and_node(models, data, tmp_path):
    dc = kit.device_class(ONNX_CLASS)
    result = execute(Job(dc, data, tmp_path, artifact_path=models["mlp"], profile=True))
    assert result.ok, result.reason
    profile = result.device.op_profile
    assert profile.available and profile.source.startswith("onnxruntime") and profile.calls == 10
    assert profile.by_op_type and profile.nodes
    # every node ran once per profiled call (the warm-up call's events are dropped)
    assert all(t.calls == 10 * t.nodes for t in profile.by_op_type.values()), profile.by_op_type
    assert {n.op_type for n in profile.nodes} == set(profile.by_op_type)
    assert profile.nodes == sorted(profile.nodes, key=lambda n: -n.total_ms)
    assert abs(sum(n.total_ms for n in profile.nodes) - sum(t.total_ms for t in profile.by_op_type.values())) < 1e-3
    assert profile.top_ops(1)[0][0] == next(iter(profile.by_op_type))
    assert results.load(tmp_path) == result


@pytest.mark.tflite_extra
def test_litert_profile_says_it_is_unavailable(tflite_models, tflite_data, tmp_path):
    job = Job(kit.device_class("x86_64-cpu-tflite"), tflite_data, tmp_path,
              artifact_path=tflite_models["fp32"], profile=True)
    result = execute(job)
    assert result.ok, result.reason
    _figures_complete(result.device, tflite_models["fp32"].stat().st_size)
    assert not result.device.op_profile.available and "no op profiler" in result.device.op_profile.reason


@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("dc_name, emulated", [
    ("x86_64-cpu-onnxruntime", False),
    pytest.param("arm64-cpu-onnxruntime", True, marks=[pytest.mark.emulated, pytest.mark.slow]),
])
def test_container_runs_report_every_figure(images, models, data, tmp_path, dc_name, emulated):
    image = images.get(dc_name, models["mlp"])
    result = execute(Job(kit.device_class(dc_name), data, tmp_path, image=image, profile=True))
    assert result.ok, f"{result.reason}\n{result.log_tail}"
    fig = result.device
    _figures_complete(fig, models["mlp"].stat().st_size)
    assert fig.emulated is emulated and result.emulated is emulated
    # the cgroup counts pages charged to this container: shared library pages already in the page cache
    # belong to whoever read them first, so it may be below VmHWM; it is there and positive
    assert fig.cgroup_peak_bytes is not None and fig.cgroup_peak_bytes > 0
    assert fig.op_profile.available and fig.op_profile.by_op_type
    assert results.load(tmp_path).device == fig
