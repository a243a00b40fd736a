"""An image's content never depends on host file modes (a 0600 artifact from umask 077 enters it readable), its tag
names everything that decides its content, and an image is used only when its lineage labels are the artifact's:
one re-tagged under a candidate's tag is built again (Docker builder) or refused (exit 2) at the orchestrator."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import gatekit
import modelkit
from fakes import FakeBackend, FakeBuilder
from tiergate import build, orchestrator
from tiergate.build import artifact_image
from tiergate.errors import EnvironmentProblem
from tiergate.images import LABEL
from tiergate.policy import load_policy
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def private_model(tmp_path):
    """A model with external data, both 0600 (onnx writes external data so under umask 077)."""
    w = np.random.default_rng(0).normal(size=(8, 4))
    path = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "m" / "model.onnx", external="model.data")
    for p in path.parent.iterdir():
        os.chmod(p, 0o600)
    os.chmod(path.parent, 0o700)
    return path


def test_the_artifact_enters_the_build_context_readable_whatever_its_host_mode(private_model, tmp_path):
    files = build.artifact_files(resolve(X86)[0], private_model)
    assert len(files) == 2 and all(_mode(p) == 0o600 for p in files)
    ctx = tmp_path / "ctx"
    ctx.mkdir(mode=0o700)
    build.artifact_context(files, ctx)
    assert _mode(ctx) == 0o755 and _mode(ctx / "model") == 0o755 and _mode(ctx / "Dockerfile") == 0o644
    assert sorted(p.name for p in (ctx / "model").iterdir()) == ["model.data", "model.onnx"]
    assert all(_mode(p) == 0o644 for p in (ctx / "model").iterdir())


def test_the_artifact_tag_names_the_recipe_not_the_host_modes(private_model, monkeypatch):
    dc = resolve(X86)[0]
    runtime = build.RuntimeImage("tiergate/runtime-onnxruntime-amd64:r", "sha256:r", {}, "base:1", True)
    files = build.artifact_files(dc, private_model)
    labels = {f"{LABEL}.artifact.sha256": "a" * 64}
    private = build.artifact_image_tag(dc, runtime, labels, files)
    for p in files:
        os.chmod(p, 0o644)
    assert build.artifact_image_tag(dc, runtime, labels, files) == private      # same content, same image
    monkeypatch.setattr(artifact_image, "ARTIFACT_RECIPE", "next")
    assert build.artifact_image_tag(dc, runtime, labels, files) != private      # a new recipe: old images unused


class _Image:
    def __init__(self, image_id, labels):
        self.id, self.labels = image_id, labels


class _Client:
    """The engine's images: a tag -> image map, as docker-py's client.images.get answers."""

    def __init__(self, images):
        self.images = self
        self._images = images

    def get(self, name):
        import docker

        if name not in self._images:
            raise docker.errors.ImageNotFound(name)
        return self._images[name]


def test_an_image_retagged_under_the_candidates_tag_is_built_again(private_model, monkeypatch, capsys):
    dc = resolve(X86)[0]
    runtime = build.RuntimeImage("tiergate/runtime-onnxruntime-amd64:r", "sha256:r", {"onnxruntime": "1"},
                                 "base:1", True)
    monkeypatch.setattr(artifact_image, "ensure_runtime_image", lambda *a, **k: runtime)
    built = []

    def docker_build(client, ctx, tag, buildargs, labels, network="none"):
        built.append(tag)
        client._images[tag] = _Image("sha256:fresh", dict(labels))
        return client._images[tag]
    monkeypatch.setattr(artifact_image, "docker_build", docker_build)
    client = _Client({})
    first = build.build_image(dc, private_model, artifact_sha256="c" * 64, client=client)
    assert built == [first.tag] and not first.reused
    other = dict(first.labels, **{f"{LABEL}.artifact.sha256": "d" * 64})
    client._images[first.tag] = _Image("sha256:other", other)          # `docker tag <another image> <tag>`
    image = build.build_image(dc, private_model, artifact_sha256="c" * 64, client=client)
    assert built == [first.tag] * 2 and image.image_id == "sha256:fresh" and not image.reused
    assert "is not what its tag names" in capsys.readouterr().err
    again = build.build_image(dc, private_model, artifact_sha256="c" * 64, client=client)
    assert again.reused and again.image_id == "sha256:fresh" and len(built) == 2      # matching labels: reused


def test_a_runtime_image_whose_labels_differ_from_its_plan_is_not_reused():
    wanted = {f"{LABEL}.runtime": "onnxruntime", f"{LABEL}.harness.sha256": "h1"}
    assert build.lineage_problems(dict(wanted), wanted) == []
    assert build.lineage_problems({**wanted, f"{LABEL}.harness.sha256": "h0"}, wanted) == \
        ["harness.sha256 is 'h0', not 'h1'"]
    assert build.lineage_problems({}, wanted)


class _WrongBuilder(FakeBuilder):
    """A builder that hands out another artifact's image (what a re-tag does to a builder that does not check)."""

    def build(self, device_class, intake):
        image = super().build(device_class, intake)
        return dataclasses.replace(image, labels={**image.labels, f"{LABEL}.artifact.sha256": "e" * 64})


def test_the_orchestrator_never_runs_an_image_labelled_with_another_artifact(tmp_path, tiergate_home):
    w = np.random.default_rng(2).normal(size=(8, 4))
    x = np.random.default_rng(3).normal(size=(50, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + 1e-4, softmax=True), tmp_path / "cand.onnx")
    backend = FakeBackend()
    seams = orchestrator.Seams(builder=_WrongBuilder(), backend_for=backend)
    with pytest.raises(EnvironmentProblem, match="holds another artifact"):
        gatekit.gate(cand, ref, tmp_path / "eval.npz", resolve(X86), load_policy(None), seams=seams)
    assert backend.runs == []


@pytest.mark.docker
def test_a_0600_candidate_with_external_data_runs_in_the_container(private_model, tmp_path, tiergate_home):
    """The harness's user (65534) reads a candidate written under umask 077 (model and external data 0600)."""
    w = np.random.default_rng(0).normal(size=(8, 4))
    x = np.random.default_rng(4).normal(size=(300, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "ref.onnx")
    run = gatekit.gate(private_model, ref, tmp_path / "eval.npz", resolve(X86), load_policy(None))
    from tiergate import results

    candidate = results.load(run.run_dirs[("candidate", X86)])
    assert candidate.ok, candidate.reason
    assert run.decision.verdict != "REJECT", run.decision.reasons

    # another image re-tagged under the candidate's tag (`docker tag`): not used, built again
    import docker

    client = docker.from_env()
    reference = results.load(run.run_dirs[("reference", X86)])
    fingerprint = client.images.get(candidate.image).labels[f"{LABEL}.fingerprint"]
    client.images.get(reference.image_id).tag(candidate.image)
    image = build.build_image(resolve(X86)[0], private_model, artifact_sha256=candidate.artifact_sha256,
                              fingerprint=fingerprint, client=client)
    assert image.tag == candidate.image and not image.reused
    assert image.labels[f"{LABEL}.artifact.sha256"] == candidate.artifact_sha256
    assert client.images.get(candidate.image).id == image.image_id != reference.image_id
    client.close()
