"""The counting QEMU and the harness's markers, without Docker: the host's own Python under the counting
qemu-x86_64 with tiergate's plugin (execution/counting.py), as an emulated x86 class's container runs it.

The tests that run it are marked `counting`: strict, like docker (a machine without it stops the run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiergate.execution.counting import COUNT_ENV, READS_ENV, counter
from tiergate.targets import resolve

pytestmark = [pytest.mark.slow]     # the tests that run the counting QEMU are marked `counting` (strict)
HARNESS = Path(__file__).resolve().parents[2] / "containers" / "harness"

# the harness's markers around a pure-Python loop of N iterations, called three times per N
PROGRAM = """
import json, sys
sys.path.insert(0, {harness!r})
import harness_insn
mark = harness_insn.marker()
mark(harness_insn.LOAD); import fractions; mark(harness_insn.LOADED)
for n in {sizes!r}:
    mark(harness_insn.CALL)
    total = 0
    for i in range(n):
        total ^= i & 255
    mark(harness_insn.CALLED)
print(json.dumps(harness_insn.figures()))
"""


def counted_run(tmp_path: Path, sizes: list[int]) -> dict:
    c = counter()
    tmp_path.mkdir()
    (dc,) = resolve("x86_64-avx2-onnxruntime")
    launcher = [part.replace("/opt/tiergate-count", str(c.folder)) for part in c.launcher(dc)]
    launcher[-1] = launcher[-1].replace("out=/tmp/tiergate-insn", f"out={tmp_path}/insn")
    env = {**os.environ, **c.environment(), COUNT_ENV: f"{tmp_path}/insn"}
    done = subprocess.run([*launcher, sys.executable, "-S", "-c",
                           PROGRAM.format(harness=str(HARNESS), sizes=sizes)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.counting
def test_a_call_counts_its_own_instructions_and_repeats(tmp_path):
    small = counted_run(tmp_path / "a", [20000] * 5)
    again = counted_run(tmp_path / "b", [20000] * 5)
    large = counted_run(tmp_path / "c", [40000] * 5)
    assert small["instructions_calls"] == 5 and small["instructions_source"] == "qemu-tcg-plugin marking thread"
    assert small["instructions_spread"] < 0.01                    # five identical calls count alike
    assert abs(small["instructions_per_inference"] - again["instructions_per_inference"]) \
        <= 0.005 * small["instructions_per_inference"]            # two processes: the same count
    ratio = large["instructions_per_inference"] / small["instructions_per_inference"]
    assert 1.9 < ratio < 2.1, ratio                               # twice the loop, twice the instructions
    assert small["load_instructions"] > 0 and small["reads_per_inference"] is None     # reads: off by default


@pytest.mark.counting
def test_reads_are_counted_when_asked_and_the_instructions_stay_the_same(tmp_path, monkeypatch):
    plain = counted_run(tmp_path / "a", [20000] * 3)
    monkeypatch.setenv(READS_ENV, "1")
    with_reads = counted_run(tmp_path / "b", [20000] * 3)
    assert with_reads["reads_per_inference"] > 0.1 * with_reads["instructions_per_inference"]
    assert abs(with_reads["instructions_per_inference"] - plain["instructions_per_inference"]) \
        <= 0.005 * plain["instructions_per_inference"]


@pytest.mark.counting
def test_the_plugin_refuses_an_unknown_argument():
    c = counter()
    done = subprocess.run([str(c.folder / "ld-linux-x86-64.so.2"), "--library-path", str(c.folder / "lib"),
                           str(c.folder / "qemu-x86_64"), "-plugin", f"{c.folder}/libtiergate_count.so,bogus=1",
                           "/bin/true"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "unknown argument bogus=1" in done.stderr


def test_an_emulated_class_container_starts_under_the_counting_qemu_and_a_native_one_does_not(monkeypatch, tmp_path):
    """The container spec alone: a counting QEMU's files in a folder of the test's own (nothing of it runs here)."""
    from tiergate.execution import Job
    from tiergate.execution.counting import IN_CONTAINER, OFF_ENV
    from tiergate.execution.docker_backend import HARNESS_IN_IMAGE, DockerBackend
    from tiergate.images import LABEL, BuiltImage

    image = BuiltImage("tiergate/x:1", "sha256:1", {f"{LABEL}.model.path": "/opt/tiergate/model/m.onnx"}, True)
    plugins = tmp_path / "qemu-plugins"
    plugins.mkdir()
    for name in ("ld-linux-x86-64.so.2", "qemu-aarch64", "qemu-x86_64", "libtiergate_count.so"):
        (plugins / name).write_bytes(b"")
    (plugins / "STAMP").write_text("test\n")
    monkeypatch.setenv("TIERGATE_SYSTEM_DIR", str(tmp_path))

    def spec(name, backend=None):
        (dc,) = resolve(name)
        return (backend or DockerBackend()).spec(Job(dc, Path("d.npz"), Path("/unused"), image=image), "in", "out")

    arm = spec("arm64-cpu-onnxruntime")
    assert arm["entrypoint"][:4] == [f"{IN_CONTAINER}/ld-linux-x86-64.so.2", "--library-path", f"{IN_CONTAINER}/lib",
                                     f"{IN_CONTAINER}/qemu-aarch64"]
    assert arm["entrypoint"][-3:] == ["/usr/bin/python3", "-s", HARNESS_IN_IMAGE]
    assert arm["volumes"][str(counter().folder)] == {"bind": IN_CONTAINER, "mode": "ro"}
    assert arm["environment"][COUNT_ENV] and arm["environment"]["PYTHONHASHSEED"] == "0"
    assert arm["environment"][READS_ENV] == "0" and arm["entrypoint"][-4].endswith(",reads=off")
    assert arm["environment"]["QEMU_CPU"] == "cortex-a76"
    avx2 = spec("x86_64-avx2-onnxruntime")
    assert f"{IN_CONTAINER}/qemu-x86_64" in avx2["entrypoint"] and "Haswell-noTSX" in avx2["entrypoint"]
    native = spec("x86_64-cpu-onnxruntime")
    assert "entrypoint" not in native and COUNT_ENV not in native["environment"]
    assert COUNT_ENV not in spec("arm64-cpu-onnxruntime", DockerBackend("ssh://edge"))["environment"]   # remote
    monkeypatch.setenv(OFF_ENV, "1")
    assert "entrypoint" not in spec("arm64-cpu-onnxruntime")


@pytest.mark.counting
def test_doctor_names_the_counting_qemu_or_says_how_to_build_it(tmp_path):
    from tiergate.doctor import check_counting

    assert check_counting().status == "ok" and "plugin" in check_counting().detail
    missing = check_counting(tmp_path)
    assert missing.status == "warn" and "scripts/build-counting-qemu" in missing.fix


# a thread in the parent, then a fork whose child starts threads of its own: the harness's batched calls
# (--eval-workers) in an artifact's child
FORK_THREADS = """
import os, threading, time
stop = threading.Event()
idle = threading.Thread(target=stop.wait)
idle.start()
pid = os.fork()
if pid == 0:
    workers = [threading.Thread(target=sum, args=(range(10000),)) for _ in range(3)]
    [w.start() for w in workers]
    [w.join() for w in workers]
    os._exit(0)
status = os.waitpid(pid, 0)[1]
stop.set()
idle.join()
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.counting
def test_a_forked_child_of_a_threaded_process_can_start_threads_under_the_counting_qemu(tmp_path):
    """QEMU 10.0's plugin core kept the parent's other vCPUs in the child after a fork, so the child's first
    thread reused one's index and failed an assertion (containers/qemu-count/plugin-fork-vcpus.patch)."""
    c = counter()
    (dc,) = resolve("x86_64-avx2-onnxruntime")
    launcher = [part.replace("/opt/tiergate-count", str(c.folder)) for part in c.launcher(dc)]
    launcher[-1] = launcher[-1].replace("out=/tmp/tiergate-insn", f"out={tmp_path}/insn")
    done = subprocess.run([*launcher, sys.executable, "-S", "-c", FORK_THREADS], capture_output=True, text=True,
                          env={**os.environ, **c.environment()}, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "0", (done.stdout, done.stderr[-2000:])
