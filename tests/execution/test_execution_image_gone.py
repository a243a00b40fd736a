"""An image removed under a running gate (issue 25, item 4) is the environment's fault: exit 2, never a failed run
and so never a REJECT. At the backend seam (a fake engine that says "No such image"), and through the
orchestrator (a backend that raises it). No engine needed."""

from __future__ import annotations

import docker
import numpy as np
import pytest

import gatekit
from fakes import FakeBackend, FakeBuilder
from tiergate import orchestrator
from tiergate.errors import EnvironmentProblem
from tiergate.execution import docker_backend
from tiergate.execution.base import ImageGone, Job
from tiergate.images import BuiltImage
from tiergate.policy import load_policy
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


class _Gone:
    """What the SDK does when the image was removed: creating a container from it raises ImageNotFound."""

    def create(self, image, **_):
        raise docker.errors.ImageNotFound(f"No such image: {image}")


class _Volume:
    def __init__(self, name):
        self.name = name

    def remove(self, force=False):
        pass


class _Client:
    containers = _Gone()

    class volumes:
        @staticmethod
        def create(name, labels=None):
            return _Volume(name)

    def info(self):
        return {"Architecture": "x86_64", "NCPU": 2}

    def close(self):
        pass


def test_an_image_removed_under_the_gate_raises_at_the_backend(tmp_path, monkeypatch):
    monkeypatch.setattr(docker_backend, "connect", lambda *a, **k: _Client())
    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((2, 3), np.float32))
    image = BuiltImage("tiergate/x86:gone", "sha256:" + "e" * 64, {"org.tiergate.model.path": "/opt/m.onnx"}, False)
    job = Job(resolve([X86])[0], data, tmp_path / "out", image=image, data_sha256="d")
    with pytest.raises(ImageGone, match="no longer on the engine") as caught:
        docker_backend.DockerBackend(attempts=1).run(job)
    assert caught.value.exit_code == 2 and "run the gate again" in caught.value.one_line()


def test_an_image_gone_during_the_runs_is_exit_2_not_a_verdict(tmp_path, tiergate_home):
    cand, ref, data = gatekit.tiny_pair(tmp_path)

    class ImageRemoved(FakeBackend):
        def run(self, job):
            raise ImageGone(f"{job.device_class.name}: image {job.image.tag} is no longer on the engine")

    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=ImageRemoved())
    with pytest.raises(EnvironmentProblem, match="no longer on the engine"):
        gatekit.gate(cand, ref, data, resolve([X86]), load_policy(None), seams=seams)
    assert not list(tiergate_home.glob("decisions/*.json"))      # no decision made, none cached
