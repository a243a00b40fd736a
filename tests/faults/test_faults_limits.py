"""Container limits: a CPU limit of the class's threads (at most the engine's CPUs), a bounded output, owner labels."""

from __future__ import annotations

from pathlib import Path

import pytest

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
