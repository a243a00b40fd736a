"""In-memory fakes of the orchestrator's seams: a builder and a backend that need no Docker.

`FakeBuilder` hands out image references; `FakeBackend` runs the artifact with the
host's onnxruntime in-process (tiny models: milliseconds) and can be told to crash
one (role, device class), to drift one device class's outputs, or to report its
engine gone. Both count their calls, so tests can assert what was built and run.
"""

from __future__ import annotations

import threading
from pathlib import Path
from dataclasses import dataclass, field

import numpy as np

from tiergate import results
from tiergate.images import LABEL, BuiltImage
from tiergate.results import MB, DeviceFigures, TargetResult, failed


_HARNESS_LOAD = threading.Lock()


def harness():
    """containers/harness/tiergate_harness.py as a module (numpy + onnxruntime only), loaded once.

    The fake runs it in threads (one per tier and shard): its runners are made under tiergate's session
    lock (`ort_session.LOCK`), since onnxruntime's session construction is not thread-safe; the real
    backends run it in processes."""
    import importlib.util
    import sys

    from tiergate.ort_session import LOCK
    from tiergate.paths import containers_dir

    name = "tiergate_harness_in_fakes"
    with _HARNESS_LOAD:
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, containers_dir() / "harness" / "tiergate_harness.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            make_runner = module.make_runner

            def locked_make_runner(args):
                with LOCK:
                    return make_runner(args)

            module.make_runner = locked_make_runner
            sys.modules[name] = module
    return sys.modules[name]


@dataclass
class FakeBuilder:
    fail: set[str] = field(default_factory=set)          # device classes whose artifact cannot be built
    environment: str | None = None                        # every build raises this EnvironmentProblem
    calls: list[tuple[str, str]] = field(default_factory=list)

    def build(self, device_class, intake) -> BuiltImage:
        from tiergate.errors import InputError

        from tiergate.errors import EnvironmentProblem

        self.calls.append((device_class.name, intake.sha256))
        if self.environment:
            raise EnvironmentProblem(self.environment)
        if device_class.name in self.fail:
            raise InputError(f"fake build of {device_class.name} failed")
        short = intake.sha256[:12]
        return BuiltImage(tag=f"fake/{device_class.name}:{short}", image_id=f"sha256:fake-{device_class.name}-{short}",
                          labels={f"{LABEL}.model.path": str(intake.artifact.path),
                                  f"{LABEL}.artifact.sha256": intake.sha256}, reused=False)


@dataclass
class FakeBackend:
    """One shared instance per test; `backend_for` returns it for every device class."""

    crash: set[tuple[str, str]] = field(default_factory=set)   # (role, device class) that segfault
    crash_shards: set[tuple[str, int]] = field(default_factory=set)   # (device class, first sample) of a shard that does
    drift: dict[str, float] = field(default_factory=dict)      # device class -> noise added to outputs
    outputs_for: dict[str, dict] = field(default_factory=dict)  # role -> outputs that replace the computed ones
    engine_gone: str | None = None
    latency_ns: int = 1_000_000
    peak_memory_mb: dict[tuple[str, str], float] = field(default_factory=dict)  # (role, class) -> reported peak
    oom: dict[str, int] = field(default_factory=dict)          # device class -> memory limit (MB) it is killed at
    # (device class, pass name) -> noise the pass adds to the candidate's outputs unless the candidate's class
    # switches it off (DeviceClass.disabled_passes): a pass that breaks a model, for tiergate bisect's tests
    broken_by: dict[tuple[str, str], float] = field(default_factory=dict)
    profiled: list[tuple[str, str]] = field(default_factory=list)   # (role, class) run with job.profile
    runs: list[tuple[str, str]] = field(default_factory=list)
    jobs: list = field(default_factory=list)                   # every job, shards apart
    name: str = "fake"
    takes_samples: bool = True                                 # honours Job.samples (shards)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, device_class):          # the orchestrator's backend_for seam
        return self

    def engine_problem(self) -> str | None:
        return self.engine_gone

    def run(self, job) -> TargetResult:
        import onnxruntime as ort

        dc = job.device_class
        with self._lock:
            if not job.samples or job.samples[0] == 0:     # a run of an artifact, counted once over its shards
                self.runs.append((job.role, dc.name))
            self.jobs.append(job)
        host = dict(tier=dc.tier, runtime=dc.runtime, emulated=dc.emulated, image=job.image.tag,
                    image_id=job.image.image_id, artifact_sha256=job.artifact_sha256, data_sha256=job.data_sha256)
        if self.engine_gone or (job.role, dc.name) in self.crash or \
                (dc.name, job.samples[0] if job.samples else 0) in self.crash_shards:
            return failed(dc.name, "crashed (segfault)", log_tail="Segmentation fault", **host)
        if dc.name in self.oom:
            return failed(dc.name, f"out of memory: killed at the device class's memory limit ({self.oom[dc.name]}m)",
                          oom_limit_bytes=self.oom[dc.name] * MB, **host)
        if job.profile and (not job.samples or job.samples[0] == 0):
            with self._lock:
                self.profiled.append((job.role, dc.name))
        args = harness().parse_args(["--runtime", "onnxruntime", "--model", job.image.labels[f"{LABEL}.model.path"],
                                     "--data", str(job.data_npz), "--out", str(job.out_dir),
                                     "--batch-size", str(dc.batch_size), "--warmup", "0"]
                                    + (["--samples", f"{job.samples[0]}:{job.samples[1]}"] if job.samples else []))
        _, _, n, outputs, _ = harness().run(args)      # the harness's own feeding, in-process
        outputs = {**outputs, **self.outputs_for.get(job.role, {})}
        for (where, name), level in sorted(self.broken_by.items()):
            if job.role == "candidate" and where == dc.name and name not in dc.disabled_passes:
                rng = np.random.default_rng(len(name))
                outputs = {k: (v + rng.normal(0, level, v.shape)).astype(v.dtype) for k, v in outputs.items()}
        noise = self.drift.get(dc.name)
        if noise:
            rng = np.random.default_rng(0)
            outputs = {k: (v + rng.normal(0, noise, v.shape)).astype(v.dtype) for k, v in outputs.items()}
        job.out_dir.mkdir(parents=True, exist_ok=True)
        np.savez(job.out_dir / results.OUTPUTS_FILE, **outputs)
        latencies = [self.latency_ns + (i % 7) * 1000 for i in range(n)]
        peak = self.peak_memory_mb.get((job.role, dc.name), 50.0)
        figures = DeviceFigures(peak_memory_bytes=int(peak * MB), baseline_memory_bytes=int(40 * MB),
                                load_memory_bytes=int((peak - 40) * MB), inference_memory_bytes=0,
                                memory_source="fake", load_ms=2.0, first_inference_ms=0.5,
                                artifact_bytes=Path(job.image.labels[f"{LABEL}.model.path"]).stat().st_size,
                                emulated=dc.emulated)
        extra = {"disabled_passes": sorted(dc.disabled_passes)} if dc.disabled_passes else {}
        return TargetResult(device_class=dc.name, status="ok", machine=dc.machine, n_samples=n,
                            latencies_ns=latencies, versions={"onnxruntime": ort.__version__}, device=figures,
                            extra=extra, **host)


class HeldBackend(FakeBackend):
    """A fake whose runs of one device class wait until the gate stops them (Job.cancel), as a container runs on
    until it is killed; every other class runs once a held run has started (the order is made, not raced)."""

    def __init__(self, held: str, **kw):
        super().__init__(**kw)
        self.held, self.stopped, self.started = held, [], threading.Event()

    def run(self, job):
        if job.device_class.name != self.held:
            assert self.started.wait(60), "the held class's run never started"
            return super().run(job)
        self.jobs.append(job)
        self.started.set()
        ended = threading.Event()
        job.cancel.on_cancel(ended.set)
        assert ended.wait(60), "the held run was never stopped"
        self.stopped.append((job.role, job.device_class.name))
        return failed(job.device_class.name, "killed by signal 9")
