"""The harness in real containers on the real engine, native x86_64 and QEMU-emulated arm64.

Images are built once per session (content-hash tags: a later session reuses them).
"""

from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

import execution_kit as kit
from tiergate import results
from tiergate.execution import DockerBackend, Job, run_target, run_targets

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1200)]


def _ok_and_close(result, out_dir, reference, machine, emulated, tol):
    assert result.ok, f"{result.reason}\n{result.log_tail}"
    assert result.machine == machine and result.emulated is emulated
    assert result.image and result.image_id.startswith("sha256:")
    assert result.n_samples == 10 and len(result.latencies_ns) == 10
    outputs = results.load_outputs(out_dir)
    for name, expected in reference.items():
        np.testing.assert_allclose(outputs[name], expected, rtol=tol, atol=tol)
    saved = results.load(out_dir)
    assert saved.machine == machine and saved.status == "ok" and saved.emulated is emulated


def _cpu_is_the_classes(dc_name: str, cpu: dict) -> None:
    """The CPU the runtime saw inside the container (CPUID / HWCAP) is the one the class names."""
    from tiergate.targets import host_cpu

    features = set(cpu["features"])
    if dc_name == "x86_64-avx2-onnxruntime":      # a Haswell edge box, whatever this host has
        assert {"avx2", "fma", "sse4_2"} <= features and not {"avx512f", "avx512_vnni", "avx_vnni"} & features
        assert "Haswell" in cpu["model"]
    elif dc_name == "arm64-cpu-onnxruntime":      # a Cortex-A76: dotprod, no SVE
        assert {"asimd", "asimddp"} <= features and "sve" not in features
    else:                                         # native: what this host has
        assert features and features <= host_cpu()[1]


@pytest.mark.parametrize("dc_name, machine, emulated", [
    ("x86_64-cpu-onnxruntime", "x86_64", False),
    pytest.param("x86_64-avx2-onnxruntime", "x86_64", True, marks=[pytest.mark.emulated, pytest.mark.slow]),
    pytest.param("arm64-cpu-onnxruntime", "aarch64", True, marks=[pytest.mark.emulated, pytest.mark.slow]),
])
def test_onnx_in_container_matches_host(images, models, data, tmp_path, dc_name, machine, emulated):
    image = images.get(dc_name, models["mlp"])
    result = run_target(dc_name, image, data, tmp_path)
    _ok_and_close(result, tmp_path, kit.host_onnx(models["mlp"], data), machine, emulated, 1e-5)
    assert result.versions["onnxruntime"] == "1.31.1"
    assert result.artifact_sha256 == kit.sha256(models["mlp"])
    assert results.load(tmp_path).data_sha256 == kit.sha256(data)
    _cpu_is_the_classes(dc_name, result.cpu)
    assert results.load(tmp_path).cpu == result.cpu                 # saved with the run


@pytest.mark.parametrize("dc_name, machine, emulated", [
    ("x86_64-cpu-tflite", "x86_64", False),
    pytest.param("arm64-cpu-tflite", "aarch64", True, marks=[pytest.mark.emulated, pytest.mark.slow]),
])
def test_tflite_in_container_matches_host(images, tflite_models, tflite_data, tmp_path, dc_name, machine, emulated):
    image = images.get(dc_name, tflite_models["fp32"])
    result = run_target(dc_name, image, tflite_data, tmp_path)
    _ok_and_close(result, tmp_path, kit.host_tflite(tflite_models["fp32"], tflite_data), machine, emulated, 1e-5)
    assert result.versions["ai-edge-litert"] == "2.3.0"


def test_container_is_confined(images, models):
    """Run a probe with the backend's own container spec: non-root, read-only, no network, limits."""
    import docker

    dc = kit.device_class("x86_64-cpu-onnxruntime", memory="256m", pids_limit=64)
    image = images.get(dc.name, models["mlp"])
    client = docker.from_env()
    spec = DockerBackend().spec(Job(dc, kit.__file__, "/unused", image=image), "unused-data", "unused-out")
    assert spec["network_mode"] == "none" and spec["read_only"] and spec["user"] == "65534:65534"
    probe = (
        "import os, socket\n"
        "print('uid', os.getuid())\n"
        "for path in ('/opt/tiergate/x', '/tmp/x'):\n"
        "    try:\n        open(path, 'w').write('x'); print('write-ok', path)\n"
        "    except OSError as e:\n        print('write-denied', path, e.errno)\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); print('net-ok')\n"
        "except OSError:\n    print('net-denied')\n"
        "print('mem', open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read().strip()"
        " if os.path.exists('/sys/fs/cgroup/memory/memory.limit_in_bytes') else open('/sys/fs/cgroup/memory.max').read().strip())\n")
    spec = {k: v for k, v in spec.items() if k not in ("volumes", "command")}
    out = client.containers.run(**spec, entrypoint=["python3", "-c", probe], remove=True)
    lines = out.decode().splitlines()
    assert "uid 65534" in lines
    assert any(line.startswith("write-denied /opt/tiergate/x 30") for line in lines)  # EROFS
    assert "write-ok /tmp/x" in lines and "net-denied" in lines
    assert f"mem {256 * 1024 * 1024}" in lines


def _bad_targets(images, models, data, tmp_path, emulated_crash: bool):
    crash_class = "arm64-cpu-onnxruntime" if emulated_crash else "x86_64-cpu-onnxruntime"
    good = kit.device_class("x86_64-cpu-onnxruntime")
    return [
        Job(good, data, tmp_path / "good", image=images.get(good.name, models["mlp"])),
        Job(kit.device_class(crash_class), data, tmp_path / "crash", image=images.get(crash_class, models["mlp"]),
            env={"TIERGATE_HARNESS_FAULT": "segv"}),
        Job(kit.device_class(good.name, memory="96m"), data, tmp_path / "oom",
            image=images.get(good.name, models["hungry"])),
        Job(kit.device_class(good.name, timeout_s=3), data, tmp_path / "timeout", image=images.get(good.name, models["mlp"]),
            env={"TIERGATE_HARNESS_FAULT": "hang"}),
    ]


def test_crash_oom_and_timeout_fail_alone(images, models, data, tmp_path):
    jobs = _bad_targets(images, models, data, tmp_path, emulated_crash=False)
    good, crash, oom, timeout = run_targets(jobs, max_parallel=2)
    assert good.ok and results.load_outputs(tmp_path / "good")["y"].shape == (10, kit.N_OUT)
    np.testing.assert_allclose(results.load_outputs(tmp_path / "good")["y"],
                               kit.host_onnx(models["mlp"], data)["y"], rtol=1e-5, atol=1e-5)
    assert crash.reason == "crashed (segfault)" and "Segmentation fault" in crash.log_tail
    assert oom.reason == "out of memory: killed at the device class's memory limit (96m)"
    assert oom.oom_limit_bytes == 96 * 1024 * 1024 and results.load(tmp_path / "oom").oom_limit_bytes == 96 * 2**20
    assert timeout.reason == "timed out after 3 s" and "hang" in timeout.log_tail
    for name, result in (("crash", crash), ("oom", oom), ("timeout", timeout)):
        saved = results.load(tmp_path / name)
        assert saved.status == "failed" and saved.reason == result.reason
        assert saved.image == result.image and not (tmp_path / name / results.OUTPUTS_FILE).exists()
    assert results.load(tmp_path / "good").ok


@pytest.mark.emulated
@pytest.mark.slow
def test_segfault_under_qemu_is_a_failed_result(images, models, data, tmp_path):
    good, crash = run_targets(_bad_targets(images, models, data, tmp_path, emulated_crash=True)[:2], max_parallel=2)
    assert good.ok
    assert crash.reason == "crashed (segfault)" and crash.emulated


def test_unreachable_engine_is_retried_then_reported(images, models, data, tmp_path):
    image = images.get("x86_64-cpu-onnxruntime", models["mlp"])
    backend = DockerBackend(f"unix://{tmp_path}/no-engine.sock", attempts=2, backoff_s=0.05)
    job = Job(kit.device_class("x86_64-cpu-onnxruntime"), data, tmp_path / "out", image=image)
    result = backend.run(job)
    assert not result.ok and "engine unreachable after 2 attempts" in result.reason


class FlakyProxy:
    """A unix socket in front of the engine that drops its first `drops` connections."""

    def __init__(self, path, drops, engine="/var/run/docker.sock"):
        self.path, self.drops, self.engine, self.seen = str(path), drops, engine, 0
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen(16)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.seen += 1
            if self.seen <= self.drops:
                conn.close()
                continue
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.engine)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst):
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.server.close()
        os.unlink(self.path)


def test_engine_fault_is_retried_and_recovers(images, models, data, tmp_path):
    image = images.get("x86_64-cpu-onnxruntime", models["mlp"])
    proxy = FlakyProxy(tmp_path / "flaky.sock", drops=1)
    try:
        backend = DockerBackend(f"unix://{proxy.path}", attempts=3, backoff_s=0.05)
        result = backend.run(Job(kit.device_class("x86_64-cpu-onnxruntime"), data, tmp_path / "out", image=image))
    finally:
        proxy.close()
    assert result.ok, result.reason
    assert proxy.seen >= 2  # the first connection was dropped, a later attempt got through


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_target_uses_cuda(images, models, data, tmp_path):
    """Needs a GPU host with the NVIDIA container runtime (skips elsewhere)."""
    image = images.get("cuda-gpu-onnxruntime", models["mlp"])
    result = run_target("cuda-gpu-onnxruntime", image, data, tmp_path)
    assert result.ok, f"{result.reason}\n{result.log_tail}"
    assert result.extra["providers"][0] == "CUDAExecutionProvider"
    np.testing.assert_allclose(results.load_outputs(tmp_path)["y"], kit.host_onnx(models["mlp"], data)["y"],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.emulated
def test_an_emulated_class_runs_on_the_cpu_model_it_names(images, models):
    """arm64 classes name a Cortex-A76 (no SVE, dotprod): QEMU presents it to the runtime, whose kernel choice
    follows the CPU's features (HWCAP), instead of QEMU's default "max" CPU (SVE and more)."""
    import docker

    dc = kit.device_class("arm64-cpu-onnxruntime")
    assert dc.emulated_cpu == "cortex-a76" and dc.container_env == {"QEMU_CPU": "cortex-a76"}
    image = images.get(dc.name, models["mlp"])
    probe = ("import ctypes; h = ctypes.CDLL(None).getauxval(16); "     # AT_HWCAP
             "print('sve' if h & (1 << 22) else 'no-sve', 'dotprod' if h & (1 << 20) else 'no-dotprod')")
    client = docker.from_env()

    def hwcaps(device_class) -> str:
        """The probe started as the class's runs start Python (under the counting QEMU where the run is counted)."""
        spec = DockerBackend().spec(Job(device_class, kit.__file__, "/unused", image=image), "unused", "unused")
        entry = spec.get("entrypoint")
        entry = entry[:-2] + ["-c", probe] if entry else ["python3", "-c", probe]     # [..., python3, -s, harness]
        volumes = {k: v for k, v in spec["volumes"].items() if v["bind"] not in ("/data", "/out")}
        spec = {k: v for k, v in spec.items() if k not in ("volumes", "command", "entrypoint")}
        return client.containers.run(**spec, volumes=volumes, entrypoint=entry, remove=True).decode().strip()

    assert hwcaps(dc) == "no-sve dotprod"
    assert hwcaps(kit.device_class(dc.name, emulated_cpu=None)) == "sve dotprod"     # QEMU's default "max"


def test_a_hung_candidate_times_out_alone_in_its_container(images, models, data, tmp_path):
    """One container for a tier's artifacts: a looping candidate (run first) is killed at its own timeout by the
    harness, and the reference after it keeps its result instead of being "timed out" with it."""
    dc = kit.device_class("x86_64-cpu-onnxruntime", timeout_s=3)
    loop = kit.looping(tmp_path / "loop.onnx")
    jobs = [Job(dc, data, tmp_path / "cand", image=images.get(dc.name, loop), artifact_path=loop, role="candidate"),
            Job(dc, data, tmp_path / "ref", image=images.get(dc.name, models["mlp"]), artifact_path=models["mlp"],
                role="reference")]
    cand, ref = DockerBackend().run_many(jobs)
    assert not cand.ok and cand.reason == "timed out after 3 s"
    assert ref.ok, f"{ref.reason}\n{ref.log_tail}"
    assert cand.extra["container"] == ref.extra["container"]              # one start for both
    np.testing.assert_allclose(results.load_outputs(tmp_path / "ref")["y"], kit.host_onnx(models["mlp"], data)["y"],
                               rtol=1e-5, atol=1e-5)


def test_an_artifact_is_read_back_as_its_harness_finishes_it_without_polling_the_engine(images, models, data,
                                                                                        tmp_path, monkeypatch):
    """Several artifacts in one container: the first is read back (on_done) when the harness says it finished it,
    while the second still runs (here: loops until its own timeout), from the container's log followed as it comes;
    the container is waited for with one wait, not asked every second."""
    import time

    import docker

    dc = kit.device_class("x86_64-cpu-onnxruntime", timeout_s=6)
    loop = kit.looping(tmp_path / "loop.onnx")
    done: dict[str, float] = {}
    jobs = [Job(dc, data, tmp_path / "ref", image=images.get(dc.name, models["mlp"]), artifact_path=models["mlp"],
                role="reference", on_done=lambda result: done.setdefault("ref", time.monotonic())),
            Job(dc, data, tmp_path / "cand", image=images.get(dc.name, loop), artifact_path=loop, role="candidate")]
    waits, wait = [], docker.models.containers.Container.wait
    monkeypatch.setattr(docker.models.containers.Container, "wait",
                        lambda self, **kw: waits.append(kw) or wait(self, **kw))
    t0 = time.monotonic()
    ref, cand = DockerBackend().run_many(jobs)
    end = time.monotonic()
    assert ref.ok and not cand.ok and cand.reason == "timed out after 6 s", f"{ref.reason} {cand.reason}"
    assert "ref" in done and done["ref"] - t0 < end - t0 - 3      # read back seconds before the candidate's timeout
    assert len(waits) == 1, waits                                   # one wait for the whole run: no polling
    assert (tmp_path / "ref" / "outputs.npz").is_file()


@pytest.mark.emulated
@pytest.mark.slow
def test_an_emulated_run_makes_its_batched_calls_two_at_once_once_the_host_grants_the_second_slot(images, models,
                                                                                                tmp_path):
    """--eval-workers 2 starting with one call slot: without a grant the calls run one at a time; the backend's
    grant (Job.on_running, SIGUSR1 once the harness says it handles it) reaches the harness in its container
    (TIERGATE_HARNESS_FAULT=await-slots holds the run until every slot is granted, or 60 s): both artifacts' calls
    then had two slots.
    Both give the outputs of the host's onnxruntime, in one container with candidate and reference."""
    data = kit.eval_data(tmp_path / "eval.npz", n=200)
    dc = kit.device_class("arm64-cpu-onnxruntime")
    grants = []

    def jobs(folder, **fields):
        return [Job(dc, data, tmp_path / folder / role, image=images.get(dc.name, models[name]),
                    artifact_path=models[name], role=role, eval_batch=64, latency_calls=4, eval_workers=2,
                    eval_slots=1, **fields)
                for role, name in (("candidate", "mlp"), ("reference", "mlp_v2"))]
    backend = DockerBackend()
    alone = backend.run_many(jobs("alone"))
    granted = backend.run_many(jobs("granted", env={"TIERGATE_HARNESS_FAULT": "await-slots"},
                                    on_running=lambda grant: grants.append(
                                        threading.Thread(target=grant, daemon=True)) or grants[-1].start()))
    for result in (*alone, *granted):
        assert result.ok, f"{result.reason}\n{result.log_tail}"
        assert result.extra["evaluation"]["eval_workers"] == 2 and result.extra["evaluation"]["batched"]
    assert [r.extra["evaluation"]["eval_slots"] for r in alone] == [1, 1]
    assert [r.extra["evaluation"]["eval_at_once"] for r in alone] == [1, 1]
    assert [r.extra["evaluation"]["eval_slots"] for r in granted] == [2, 2]      # the grant reached the harness
    assert all(r.extra["evaluation"]["eval_at_once"] in (1, 2) for r in granted)  # tiny calls may not overlap
    assert len(grants) == 1 and granted[0].extra["container"] == granted[1].extra["container"]
    assert granted[0].extra["container"]["artifacts"] == 2
    for role, name in (("candidate", "mlp"), ("reference", "mlp_v2")):
        want = kit.host_onnx(models[name], data)["y"]
        for folder in ("alone", "granted"):
            np.testing.assert_allclose(results.load_outputs(tmp_path / folder / role)["y"], want, rtol=1e-5,
                                       atol=1e-5)



def test_the_files_copied_in_while_the_container_starts_are_waited_for_and_a_failed_copy_is_retried(
        images, models, data, tmp_path, monkeypatch):
    """The job's files go into its data volume on a thread while its container starts (docker_backend._copy_beside):
    a copy that begins only once the container runs is waited for (the harness reads the data once the copy's last
    file is there), and a copy that fails fails its attempt, whose container and volumes go, and the next attempt
    runs."""
    import time

    import docker

    from tiergate.errors import InfrastructureFault
    from tiergate.execution import docker_backend, janitor

    image = images.get("x86_64-cpu-onnxruntime", models["mlp"])
    real, calls = docker_backend.upload, []

    def started_then_real(client, image_ref, volume, files, mount="/data", ready=None):
        calls.append(ready)
        if len(calls) == 1:
            raise InfrastructureFault("the copy failed (test)")
        deadline = time.monotonic() + 120   # the copy begins once the harness's container runs: it waits for the data
        while not client.containers.list(filters={"status": "running", "volume": volume}):
            assert time.monotonic() < deadline, "the run's container never started"
            time.sleep(0.05)
        real(client, image_ref, volume, files, mount, ready)
    monkeypatch.setattr(docker_backend, "upload", started_then_real)
    backend = DockerBackend(attempts=2, backoff_s=0.05)
    result = backend.run(Job(kit.device_class("x86_64-cpu-onnxruntime"), data, tmp_path / "out", image=image))
    assert result.ok, f"{result.reason}\n{result.log_tail}"
    assert calls == [docker_backend.READY_NAME] * 2
    np.testing.assert_allclose(results.load_outputs(tmp_path / "out")["y"], kit.host_onnx(models["mlp"], data)["y"],
                               rtol=1e-5, atol=1e-5)
    client = docker.from_env()
    filters = {"label": [f"{k}={v}" for k, v in janitor.owner_labels().items()]}
    assert not client.containers.list(all=True, filters=filters)       # the failed attempt's container went too
    assert not client.volumes.list(filters=filters)

    calls.clear()
    monkeypatch.setattr(docker_backend, "upload", lambda *a, **k: (_ for _ in ()).throw(
        InfrastructureFault("the copy failed (test)")))
    failed = backend.run(Job(kit.device_class("x86_64-cpu-onnxruntime"), data, tmp_path / "out2", image=image))
    assert not failed.ok and "the copy failed (test)" in failed.reason
    assert not client.containers.list(all=True, filters=filters) and not client.volumes.list(filters=filters)
