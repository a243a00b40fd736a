"""Image builds on the real engine: content-hash tags, reuse, the artifact as the last layer, labels."""

from __future__ import annotations

import json
import subprocess

import docker
import pytest

import execution_kit as kit
from tiergate.build import LABEL, build_image, ca_bundle_bytes, ensure_runtime_image, plan_runtime_image
from tiergate.errors import EnvironmentProblem, InputError

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1200)]
X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture(scope="module")
def client():
    c = docker.from_env()
    yield c
    c.close()


def test_unchanged_inputs_reuse_the_image(images, models, client):
    first = images.get(X86, models["mlp"])
    again = build_image(kit.device_class(X86), models["mlp"], artifact_sha256=kit.sha256(models["mlp"]),
                        fingerprint="test-mlp")
    assert again.reused and again.runtime_reused
    assert (again.tag, again.image_id) == (first.tag, first.image_id)
    labels = client.images.get(first.tag).labels
    assert labels[f"{LABEL}.artifact.sha256"] == kit.sha256(models["mlp"])
    assert labels[f"{LABEL}.fingerprint"] == "test-mlp"
    assert labels[f"{LABEL}.device_class"] == X86 and labels[f"{LABEL}.tier"] == "x86-server"
    assert json.loads(labels[f"{LABEL}.versions"]) == {"onnxruntime": "1.31.1", "numpy": "2.4.6"}
    assert labels[f"{LABEL}.cost_per_hour"] == "0.096" and labels[f"{LABEL}.cost.billing"] == "cloud-cpu"
    assert labels[f"{LABEL}.model.path"] == "/opt/tiergate/model/mlp.onnx"


def test_new_artifact_adds_only_the_last_layer(images, models, client):
    old = images.get(X86, models["mlp"])
    new = images.get(X86, models["mlp_v2"])
    assert new.tag != old.tag and new.runtime_tag == old.runtime_tag
    runtime_layers = client.images.get(old.runtime_tag).attrs["RootFS"]["Layers"]
    for built in (old, new):
        layers = client.images.get(built.tag).attrs["RootFS"]["Layers"]
        assert layers[:-1] == runtime_layers and len(layers) == len(runtime_layers) + 1
    assert client.images.get(old.tag).attrs["RootFS"]["Layers"][-1] != \
        client.images.get(new.tag).attrs["RootFS"]["Layers"][-1]


def test_a_new_fingerprint_is_a_new_tag(images, models):
    base = images.get(X86, models["mlp"])
    other = build_image(kit.device_class(X86), models["mlp"], artifact_sha256=kit.sha256(models["mlp"]),
                        fingerprint="another-fingerprint")
    assert other.tag != base.tag and other.labels[f"{LABEL}.fingerprint"] == "another-fingerprint"
    assert other.runtime_reused


def test_base_image_problems_are_environment_problems(models, client):
    with pytest.raises(EnvironmentProblem, match="is not present and cannot be pulled"):
        build_image(kit.device_class(X86), models["mlp"], artifact_sha256="x",
                    base_image="tiergate/no-such-base:never")
    with pytest.raises(EnvironmentProblem, match="is for amd64, but arm64-cpu-onnxruntime needs arm64"):
        plan_runtime_image(kit.device_class("arm64-cpu-onnxruntime"), client=client,
                           base_image="tiergate/base:bookworm-amd64")


@pytest.fixture(scope="module")
def extra_ca(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ca")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=tiergate test proxy CA", "-keyout", str(folder / "ca.key"),
                    "-out", str(folder / "ca.pem")], check=True, capture_output=True)
    return folder / "ca.pem"


def test_extra_ca_bundle_is_part_of_the_image_inputs(extra_ca, tmp_path, client):
    combined = ca_bundle_bytes(extra_ca)
    assert combined.endswith(extra_ca.read_bytes()) and combined.count(b"BEGIN CERTIFICATE") > 1
    dc = kit.device_class(X86)
    assert plan_runtime_image(dc, client=client, ca_bundle=extra_ca).tag != plan_runtime_image(dc, client=client).tag
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(InputError, match="bad.pem: not a PEM CA bundle"):
        ca_bundle_bytes(tmp_path / "bad.pem")
    with pytest.raises(InputError, match="CA bundle does not exist"):
        ca_bundle_bytes(tmp_path / "missing.pem")


@pytest.mark.slow
def test_pip_inside_the_build_with_an_extra_ca_bundle(extra_ca, client):
    """pip_mode='image': pip runs in the build against the index, trusting host + extra CAs."""
    runtime = ensure_runtime_image(kit.device_class(X86), client=client, ca_bundle=extra_ca, pip_mode="image")
    out = client.containers.run(runtime.tag, ["-c", "import onnxruntime, numpy; print(onnxruntime.__version__, "
                                "numpy.__version__)"], entrypoint=["python3"], network_mode="none", remove=True)
    assert out.decode().split() == ["1.31.1", "2.4.6"]
