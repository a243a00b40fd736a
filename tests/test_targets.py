"""The device-class catalogue: the shipped files load, bad files name the file and the field."""

from __future__ import annotations

import pytest

from tiergate import targets
from tiergate.errors import InputError

REQUIRED = ["x86_64-cpu-onnxruntime", "x86_64-cpu-tflite", "x86_64-avx2-onnxruntime", "arm64-cpu-onnxruntime",
            "arm64-cpu-tflite", "cuda-gpu-onnxruntime"]

GOOD = """tier = "t"
arch = "arm64"
runtime = "onnxruntime"
runtime_version = "1.31.1"
threads = 2
execution = "emulated"
cost_per_hour = 0.01
"""


def test_shipped_catalogue_has_the_required_classes():
    cat = targets.catalogue()
    assert set(REQUIRED) <= set(cat)
    assert cat["arm64-cpu-onnxruntime"].emulated and cat["arm64-cpu-onnxruntime"].machine == "aarch64"
    assert not cat["x86_64-cpu-tflite"].emulated and cat["x86_64-cpu-tflite"].artifact_format == "tflite"
    assert cat["cuda-gpu-onnxruntime"].gpu


def test_adding_a_class_is_adding_a_file(tmp_path):
    (tmp_path / "pi5-onnxruntime.toml").write_text(GOOD + 'docker_host = "ssh://pi@10.0.0.5"\n')
    dc = targets.catalogue(tmp_path)["pi5-onnxruntime"]
    assert dc.docker_host == "ssh://pi@10.0.0.5" and dc.threads == 2 and dc.batch_size == 1


@pytest.mark.parametrize("text, field", [
    (GOOD.replace('arch = "arm64"', 'arch = "riscv"'), "arch"),
    (GOOD.replace("threads = 2", 'threads = "two"'), "threads"),
    (GOOD.replace('tier = "t"\n', ""), "tier"),
    (GOOD + "colour = 1\n", "colour"),
    (GOOD + '[container]\nmemroy = "1g"\n', "container.memroy"),
    (GOOD.replace('execution = "emulated"', 'execution = "remote"'), "docker_host"),
    (GOOD + '[build]\nrequirments = "onnxruntime"\n', "build.requirments"),
    (GOOD + '[build]\nrequirements = "no-such-lock"\n', "build.requirements"),
    (GOOD + '[build]\nrequirements = "../onnxruntime"\n', "build.requirements"),
    (GOOD + '[build]\nenv = "A=1"\n', "build.env"),
    (GOOD + '[build]\nenv = { "1A" = "x" }\n', "build.env.1A"),
    (GOOD + '[build]\nenv = { OMP_NUM_THREADS = 1 }\n', "build.env.OMP_NUM_THREADS"),
    (GOOD + '[build]\nenv = { PYTHONPATH = "/x" }\n', "build.env.PYTHONPATH"),
    (GOOD + '[build]\nenv = { A = "1", B = "2", C = "3", D = "4", E = "5" }\n', "build.env"),
    (GOOD + 'memory_limit_mb = "512"\n', "memory_limit_mb"),
    (GOOD + "memory_limit_mb = 4\n", "memory_limit_mb"),
    (GOOD + 'memory_limit_mb = 512\n[container]\nmemory = "1g"\n', "memory_limit_mb"),
    (GOOD + '[container]\nmemory = "lots"\n', "container.memory"),
    (GOOD + 'emulated_cpu = "Cortex A76!"\n', "emulated_cpu"),
    (GOOD.replace('execution = "emulated"', 'execution = "native"') + 'emulated_cpu = "cortex-a76"\n', "emulated_cpu"),
    (GOOD + '[cpu]\nrequires = ["AVX 2"]\n', "cpu.requires"),
    (GOOD + '[cpu]\nlacks = "sve"\n', "cpu.lacks"),
    (GOOD + '[cpu]\nrequires = ["sve"]\nlacks = ["sve"]\n', "cpu"),
    (GOOD + '[cpu]\non_mismatch = "ignore"\n', "cpu.on_mismatch"),
    (GOOD.replace('execution = "emulated"', 'execution = "native"') + '[cpu]\non_mismatch = "emulate"\n',
     "cpu.on_mismatch"),
    (GOOD + "[evaluation]\nbatch = -1\n", "evaluation.batch"),
    (GOOD + "[evaluation]\nlatency_calls = 0\n", "evaluation.latency_calls"),
    (GOOD + "[evaluation]\nshard_samples = 0\n", "evaluation.shard_samples"),
    (GOOD + "[evaluation]\nshard = 2\n", "evaluation.shard"),
    (GOOD + '[evaluation]\nshards = "2"\n', "evaluation.shards"),
])
def test_bad_file_names_file_and_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        targets.catalogue(tmp_path)
    assert str(path) in err.value.message and f"'{field}'" in err.value.message


def test_build_arguments_default_from_the_runtime(tmp_path):
    cat = targets.catalogue()
    assert cat["x86_64-cpu-onnxruntime"].build == targets.RuntimeBuild("onnxruntime", {})
    assert cat["arm64-cpu-tflite"].build.requirements_path.name == "tflite.txt"
    assert cat["arm64-cpu-tflite"].build.requirements_path.is_file()
    assert cat["cuda-gpu-onnxruntime"].build.env["NVIDIA_VISIBLE_DEVICES"] == "all"
    gpu = GOOD.replace('runtime = "onnxruntime"', 'runtime = "onnxruntime-gpu"') + "gpu = true\n"
    (tmp_path / "gpu-box.toml").write_text(gpu)
    assert targets.catalogue(tmp_path)["gpu-box"].build == targets.default_build("onnxruntime-gpu")
    assert targets.default_build("onnxruntime-gpu").env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


def test_build_table_overrides_the_defaults(tmp_path):
    (tmp_path / "tuned.toml").write_text(GOOD + '[build]\nrequirements = "onnxruntime-gpu"\n'
                                         'env = { OMP_WAIT_POLICY = "PASSIVE" }\n')
    dc = targets.catalogue(tmp_path)["tuned"]
    assert dc.build.requirements == "onnxruntime-gpu" and dc.build.env == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_unknown_class_lists_known_ones():
    with pytest.raises(InputError) as err:
        targets.resolve("x86_64-cpu-onnxruntime,no-such-class")
    assert "no-such-class" in err.value.message and "arm64-cpu-tflite" in err.value.message


def test_memory_limit_is_the_device_memory_and_the_older_spelling_still_loads(tmp_path):
    (tmp_path / "board-512.toml").write_text(GOOD + "memory_limit_mb = 512\n")
    (tmp_path / "legacy.toml").write_text(GOOD + '[container]\nmemory = "1g"\n')
    (tmp_path / "plain.toml").write_text(GOOD)
    cat = targets.catalogue(tmp_path)
    assert cat["board-512"].limits.memory == "512m" and cat["board-512"].limits.memory_mb == 512
    assert cat["legacy"].limits.memory_bytes == 2**30 and cat["plain"].limits.memory == "2g"
    shipped = targets.catalogue()
    assert shipped["x86_64-cpu-onnxruntime"].limits.memory_mb == 2048
    assert shipped["cuda-gpu-onnxruntime"].limits.memory_mb == 8192


def test_evaluation_defaults_follow_the_execution(tmp_path, monkeypatch):
    """Emulated classes batch their outputs and shard by the cores available; native ones time every call."""
    (tmp_path / "emu.toml").write_text(GOOD)
    (tmp_path / "nat.toml").write_text(GOOD.replace('execution = "emulated"', 'execution = "native"'))
    (tmp_path / "set.toml").write_text(GOOD + "[evaluation]\nbatch = 0\nshards = 3\n")
    cat = targets.catalogue(tmp_path)
    emu, nat, fixed = cat["emu"], cat["nat"], cat["set"]
    # emulated latency is never gated: 4 single calls (they check the batched outputs), after the first call only
    assert emu.evaluation == targets.Evaluation(batch=64, latency_calls=4, warmup=1, latency_pairs=0, shards=0)
    assert nat.evaluation == targets.Evaluation(batch=0, latency_calls=16, warmup=3, latency_pairs=200, shards=0)
    (tmp_path / "warm.toml").write_text(GOOD + "[evaluation]\nwarmup = 5\nlatency_calls = 8\n")
    assert targets.catalogue(tmp_path)["warm"].evaluation == targets.Evaluation(batch=64, latency_calls=8, warmup=5, latency_pairs=0)
    (tmp_path / "warm.toml").unlink()
    (tmp_path / "cold.toml").write_text(GOOD + "[evaluation]\nwarmup = 0\n")
    with pytest.raises(InputError, match="evaluation.warmup.*at least 1"):
        targets.catalogue(tmp_path)
    (tmp_path / "cold.toml").unlink()
    assert fixed.evaluation.batch == 0 and fixed.evaluation.shards == 3
    monkeypatch.setattr(targets.host, "available_cores", lambda: 8)
    # threads = 2: four containers fit in 8 cores, at most one per 64 samples; native: one
    assert [emu.evaluation.shard_count(emu, n) for n in (10, 64, 200, 1000)] == [1, 1, 3, 4]
    assert nat.evaluation.shard_count(nat, 1000) == 1 and nat.evaluation.shard_count(nat, 1000, 5) == 5
    assert fixed.evaluation.shard_count(fixed, 2) == 2 and fixed.evaluation.shard_count(fixed, 1000) == 3
    # a class whose samples are slow to emulate spreads a run sooner: at least 16 samples a shard
    (tmp_path / "slow.toml").write_text(GOOD + "[evaluation]\nshard_samples = 16\n")
    slow = targets.catalogue(tmp_path)["slow"]
    assert [slow.evaluation.shard_count(slow, n) for n in (10, 40, 96, 1000)] == [1, 2, 4, 4]
    assert cat["emu"].emulated_cpu is None and cat["emu"].container_env == {}


# --- the CPU behind a class -----------------------------------------------------------------------------------

NATIVE_X86 = """tier = "edge"
arch = "amd64"
runtime = "onnxruntime"
runtime_version = "1.31.1"
threads = 1
execution = "native"
cost_per_hour = 0.01
"""


def _host(monkeypatch, *features, model="Test CPU"):
    monkeypatch.setattr(targets.host, "host_cpu", lambda: (model, frozenset(features)))


def test_a_native_class_is_refused_on_a_host_whose_cpu_is_not_the_devices(tmp_path, monkeypatch):
    from tiergate.errors import EnvironmentProblem

    (tmp_path / "avx2-box.toml").write_text(NATIVE_X86 + '[cpu]\nrequires = ["avx2", "fma"]\n'
                                                         'lacks = ["avx512_vnni", "avx512f"]\n')
    _host(monkeypatch, "sse2", "avx2", "fma")
    assert targets.resolve("avx2-box", tmp_path)[0].execution == "native"        # the device's CPU: runs natively
    _host(monkeypatch, "sse2", "avx2", "fma", "avx512f", "avx512_vnni")
    with pytest.raises(EnvironmentProblem) as caught:
        targets.resolve("avx2-box", tmp_path)
    line = caught.value.one_line()
    assert caught.value.exit_code == 2 and "avx2-box" in line and "has avx512_vnni, avx512f, which the device lacks" \
        in line.replace("avx512f, avx512_vnni", "avx512_vnni, avx512f") and "\n" not in line
    _host(monkeypatch, "sse2")
    with pytest.raises(EnvironmentProblem, match="lacks avx2, fma, which the device has"):
        targets.resolve("avx2-box", tmp_path)
    assert targets.resolve("avx2-box", tmp_path, host=False)[0].execution == "native"   # the catalogue as written


def test_a_native_class_may_emulate_its_cpu_instead(tmp_path, monkeypatch):
    (tmp_path / "avx2-box.toml").write_text(NATIVE_X86 + 'emulated_cpu = "Haswell-noTSX"\n[cpu]\nlacks = '
                                                         '["avx512_vnni"]\non_mismatch = "emulate"\n')
    _host(monkeypatch, "avx2", "avx512_vnni")
    dc = targets.resolve("avx2-box", tmp_path)[0]
    assert dc.emulated and dc.evaluation.batch == 64
    assert dc.launcher == [targets.EMULATOR_IN_IMAGE, "-cpu", "Haswell-noTSX"] and dc.cpu_key == "Haswell-noTSX"
    assert targets.cpu_verdict(dc)[0] == "emulated"


def test_the_cpu_is_part_of_a_native_class_s_identity(monkeypatch):
    dc = targets.catalogue()["x86_64-cpu-onnxruntime"]
    _host(monkeypatch, "avx2", "fma")
    without_vnni = dc.cpu_key
    _host(monkeypatch, "avx2", "fma", "avx512_vnni")
    assert dc.cpu_key != without_vnni and dc.cpu_key.startswith("host-")
    assert targets.catalogue()["arm64-cpu-onnxruntime"].cpu_key == "cortex-a76"
    avx2 = targets.catalogue()["x86_64-avx2-onnxruntime"]
    assert avx2.emulated and avx2.launcher[1:] == ["-cpu", "Haswell-noTSX"]
    assert avx2.cpu.requires == ("avx2", "fma") and "avx512_vnni" in avx2.cpu.lacks


def test_host_cpu_reads_proc_cpuinfo(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 fma\n\n"
                    "processor\t: 1\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 fma\n")
    monkeypatch.setattr(targets.host, "CPUINFO", info)
    targets.host_cpu.cache_clear()
    try:
        assert targets.host_cpu() == ("Some CPU", frozenset({"fpu", "sse2", "avx2", "fma"}))
    finally:
        targets.host_cpu.cache_clear()
