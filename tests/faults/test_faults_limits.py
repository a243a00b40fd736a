"""Container limits: a CPU limit of the class's threads (at most the engine's CPUs), a bounded output, owner labels."""

from __future__ import annotations


import numpy as np
import pytest

from tiergate import results, state
from tiergate.errors import InputError

from tiergate.execution import janitor
from tiergate.execution.base import Job
from tiergate.execution.docker_backend import OUTPUT_LIMIT_BYTES, DockerBackend
from tiergate.images import BuiltImage
from tiergate.targets import resolve

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("engine_cpus", [None, 1, 64])
def test_the_container_spec_carries_cpu_output_and_owner_limits(tmp_path, engine_cpus):
    dc = resolve(["x86_64-cpu-onnxruntime"])[0]
    job = Job(dc, tmp_path / "d.npz", tmp_path / "out", image=BuiltImage("t:1", "sha256:x", {"org.tiergate.model.path": "/opt/m.onnx"}, False))
    spec = DockerBackend().spec(job, "vd", "vo", engine_cpus=engine_cpus)
    cpus = dc.threads if engine_cpus is None else min(dc.threads, engine_cpus)
    assert spec["image"] == "sha256:x"       # the checked image by id: a re-tag after the build cannot swap it
    assert spec["nano_cpus"] == cpus * 1_000_000_000
    fsize = [u for u in spec["ulimits"] if u["Name"] == "fsize"]
    assert fsize and fsize[0]["Soft"] == fsize[0]["Hard"] == OUTPUT_LIMIT_BYTES
    assert spec["labels"][janitor.OWNER_PID] == str(__import__("os").getpid())
    assert spec["labels"][janitor.OWNER_HOST] == janitor.hostname()


def test_an_owner_whose_pid_was_reused_is_dead():
    labels = janitor.owner_labels()
    assert janitor.owner_alive(labels)
    assert not janitor.owner_alive({**labels, janitor.OWNER_START: "1"})   # same pid, another start time
    assert not janitor.owner_alive({**labels, janitor.OWNER_PID: "999999999"})


# --- what the host reads of a run's outputs is capped (issue 25, minor) ------------------------------------------


def _mlp(tmp_path):
    import modelkit

    return modelkit.write(modelkit.mlp(features=4, outputs=4), tmp_path / "mlp.onnx")


def _data(path, n):
    np.savez(path, x=np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32))
    return path


def test_outputs_over_the_limit_are_a_failed_run_not_a_crash(tmp_path, monkeypatch):
    """A run whose outputs exceed the per-run limit fails with one line (sizes read from the .npy headers)."""
    from tiergate.execution import LocalProcessBackend

    dc = resolve(["x86_64-cpu-onnxruntime"])[0]
    monkeypatch.setattr(results, "OUTPUT_LIMIT_BYTES", 1000)
    job = Job(dc, _data(tmp_path / "d.npz", 64), tmp_path / "out", artifact_path=_mlp(tmp_path))
    result = LocalProcessBackend().run(job)             # 64 samples x 4 float32 = 1024 bytes of outputs
    assert not result.ok
    assert result.reason.startswith("its outputs hold 1024 bytes, over the output limit of 1000 bytes per run")
    monkeypatch.setattr(results, "OUTPUT_LIMIT_BYTES", 1024)
    assert LocalProcessBackend().run(job).ok


def test_the_limit_is_checked_before_loading(tmp_path):
    """An outputs.npz whose header declares 4 TB is refused from the header alone: no allocation, no MemoryError."""
    import zipfile

    folder = tmp_path / "run"
    folder.mkdir()
    with zipfile.ZipFile(folder / results.OUTPUTS_FILE, "w") as archive:
        with archive.open("y.npy", "w") as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)})
    assert results.outputs_nbytes(folder) == 4 * 10 ** 12
    with pytest.raises(InputError, match="over the output limit"):
        results.load_outputs(folder)


def _shards(tmp_path, n_shards, rows):
    folders = []
    for k in range(n_shards):
        folder = tmp_path / f"{k * rows}-{(k + 1) * rows}"
        outputs = {"y": np.full((rows, 1024), k, np.float32), "ids": np.arange(k * rows, (k + 1) * rows)}
        results.save(results.TargetResult("x86_64-cpu-onnxruntime", "ok", n_samples=rows, image_id="i",
                                          latencies_ns=[1]), folder, outputs)
        folders.append(folder)
    return folders


def test_merging_shards_streams_them(tmp_path):
    """Shards are joined one array at a time: the peak is about one shard's array, not the run twice."""
    import tracemalloc

    from tiergate.orchestrator.spans import merge_shards

    parts = _shards(tmp_path, 4, 512)                   # 2 MiB of "y" per shard, 8 MiB in all
    tracemalloc.start()
    try:
        merged = merge_shards(parts, tmp_path / "work")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert merged.ok and merged.n_samples == 2048
    assert peak < 4 * 1024 ** 2, f"merging 8 MiB of shards peaked at {peak / 1024 ** 2:.1f} MiB"
    out = results.load_outputs(tmp_path / "work")
    assert out["y"].shape == (2048, 1024) and [out["y"][i * 512, 0] for i in range(4)] == [0, 1, 2, 3]
    np.testing.assert_array_equal(out["ids"], np.arange(2048))
    (tmp_path / "runs").mkdir()
    state.replace_dir(tmp_path / "work", tmp_path / "runs" / "merged")     # placed as a run is: sealed (issue 42)
    assert state.verified(tmp_path / "runs" / "merged")


def test_shards_over_the_limit_together_fail_the_run(tmp_path, monkeypatch):
    from tiergate.orchestrator.spans import merge_shards

    parts = _shards(tmp_path, 2, 16)                    # 16 x 1024 float32 + 16 int64 per shard
    monkeypatch.setattr(results, "OUTPUT_LIMIT_BYTES", 100_000)   # each shard's 65,664 bytes is under it
    merged = merge_shards(parts, tmp_path / "work")
    assert not merged.ok and "over the output limit of 100000 bytes per run" in merged.reason
