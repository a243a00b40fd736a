"""Image builds on the real engine: content-hash tags, reuse, the artifact as the last layer, labels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import docker
import pytest

import execution_kit as kit
from tiergate.build import (LABEL, build_image, ca_bundle_bytes, ensure_runtime_image, harness_files,
                            plan_runtime_image)
from tiergate.errors import EnvironmentProblem, InputError
from tiergate.targets import RuntimeBuild

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


def test_build_arguments_are_part_of_the_runtime_tag(client):
    dc = kit.device_class(X86)
    plain = plan_runtime_image(dc, client=client)
    assert plain.buildargs == {"BASE_IMAGE": "tiergate/base:bookworm-amd64"}
    with_env = plan_runtime_image(kit.device_class(X86, build=RuntimeBuild("onnxruntime", {"OMP_WAIT_POLICY": "PASSIVE"})),
                                  client=client)
    assert with_env.buildargs["ENV_1_NAME"] == "OMP_WAIT_POLICY" and with_env.buildargs["ENV_1_VALUE"] == "PASSIVE"
    assert with_env.tag != plain.tag and with_env.labels[f"{LABEL}.env"] == '{"OMP_WAIT_POLICY": "PASSIVE"}'
    other_lock = plan_runtime_image(kit.device_class(X86, build=RuntimeBuild("onnxruntime-gpu")), client=client)
    assert other_lock.tag != plain.tag and "onnxruntime-gpu==1.31.1" in other_lock.lock
    gpu = plan_runtime_image(kit.device_class("cuda-gpu-onnxruntime"), client=client)
    assert gpu.buildargs["ENV_1_NAME"] == "NVIDIA_DRIVER_CAPABILITIES" and gpu.buildargs["ENV_2_VALUE"] == "all"


def test_a_harness_file_change_is_a_new_runtime_tag(client, tmp_path, monkeypatch):
    import shutil

    from tiergate.paths import project_root

    root = tmp_path / "checkout"
    shutil.copytree(project_root() / "containers", root / "containers")
    shutil.copytree(project_root() / "targets", root / "targets")
    before = plan_runtime_image(kit.device_class(X86), client=client).tag
    monkeypatch.setenv("TIERGATE_ROOT", str(root))
    assert plan_runtime_image(kit.device_class(X86), client=client).tag == before
    (root / "containers" / "harness" / "__pycache__").mkdir(exist_ok=True)
    (root / "containers" / "harness" / "__pycache__" / "x.pyc").write_bytes(b"ignored")
    assert plan_runtime_image(kit.device_class(X86), client=client).tag == before
    (root / "containers" / "harness" / "harness_extra.py").write_text("# a second script\n")
    assert "harness_extra.py" in {p.name for p in harness_files()}
    assert plan_runtime_image(kit.device_class(X86), client=client).tag != before


def test_runtime_image_holds_the_whole_harness_folder_and_the_env(client):
    dc = kit.device_class(X86, build=RuntimeBuild("onnxruntime", {"TIERGATE_TEST_ENV": "a b,c"}))
    runtime = ensure_runtime_image(dc, client=client)
    try:
        env = client.images.get(runtime.tag).attrs["Config"]["Env"]
        assert "TIERGATE_TEST_ENV=a b,c" in env and "PYTHONPATH=/opt/tiergate/site-packages" in env
        listing = ("import os, json; h = '/opt/tiergate/harness'; print(json.dumps([sorted(os.listdir(h)), "
                   "sorted(n.split('.')[0] for n in os.listdir(h + '/__pycache__'))]))")
        out = client.containers.run(runtime.tag, ["-c", listing], entrypoint=["python3"], network_mode="none",
                                    remove=True)
        files, compiled = json.loads(out.decode().strip().splitlines()[-1])
        assert files == sorted([p.name for p in harness_files()] + ["__pycache__"])
        # every module compiled once, in the image (a run's read-only image would compile it at each start)
        assert compiled == sorted(p.stem for p in harness_files() if p.suffix == ".py")
    finally:
        if not runtime.reused:
            client.images.remove(runtime.tag)


def test_two_processes_needing_one_new_image_build_it_once(images, models, tmp_path, client):
    """Two gates at once on one engine: the second waits on the tag's build lock and reuses the first's image
    (without the lock each built its own and the last tag won: two image ids, two run keys)."""
    images.get(X86, models["mlp"])                      # the runtime image exists: only the artifact layer builds
    fingerprint = f"build-lock-{tmp_path.name}"          # a tag no earlier run has built
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); import execution_kit as kit\n"
              "from pathlib import Path; from tiergate.build import build_image\n"
              "m = Path(sys.argv[3])\n"
              "b = build_image(kit.device_class(sys.argv[2]), m, artifact_sha256=kit.sha256(m),"
              " fingerprint=sys.argv[4])\n"
              "print(json.dumps([b.tag, b.image_id, b.reused]))\n")
    tests = str(Path(__file__).resolve().parent)
    procs = [subprocess.Popen([sys.executable, "-c", script, tests, X86, str(models["mlp"]), fingerprint],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    done = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-800:] for _, err in done]
    built = [json.loads(out.strip().splitlines()[-1]) for out, _ in done]
    try:
        assert built[0][:2] == built[1][:2]                  # one tag, one image id
        assert sorted(reused for _, _, reused in built) == [False, True]
        assert client.images.get(built[0][0]).id == built[0][1]
    finally:
        client.images.remove(built[0][0], force=True)
