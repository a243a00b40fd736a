"""Pure unit tests of the execution and build modules: no engine needed, so no `docker` marker."""

from __future__ import annotations

import pytest

import execution_kit as kit
from tiergate.build import build_image, platform_tags
from tiergate.errors import InputError
from tiergate.execution import DockerBackend, backend_for

X86 = "x86_64-cpu-onnxruntime"


def test_artifact_problems_are_input_errors(tmp_path, models, tflite_models):
    dc = kit.device_class(X86)
    with pytest.raises(InputError, match="cannot run on x86_64-cpu-onnxruntime"):
        build_image(dc, tflite_models["fp32"], artifact_sha256="x")
    with pytest.raises(InputError, match="artifact does not exist"):
        build_image(dc, tmp_path / "none.onnx", artifact_sha256="x")
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a model")
    with pytest.raises(InputError, match="junk.onnx: is not an ONNX or TFLite model"):
        build_image(dc, tmp_path / "junk.onnx", artifact_sha256="x")
    (tmp_path / "junk.tflite").write_bytes(b"\x00" * 64)
    with pytest.raises(InputError, match="is not a TFLite model"):
        build_image(kit.device_class("x86_64-cpu-tflite"), tmp_path / "junk.tflite", artifact_sha256="x")


def test_backend_choice_follows_the_device_class():
    gpu = backend_for(kit.device_class("cuda-gpu-onnxruntime"))
    remote = backend_for(kit.device_class("x86_64-cpu-onnxruntime", execution="remote",
                                          docker_host="ssh://edge@127.0.0.1:2222"))
    assert isinstance(gpu, DockerBackend) and gpu.gpu
    assert remote.docker_host == "ssh://edge@127.0.0.1:2222" and not remote.gpu


def test_platform_tags_cover_manylinux():
    tags = platform_tags("aarch64")
    assert "manylinux2014_aarch64" in tags and "manylinux_2_28_aarch64" in tags
    assert all(t.endswith("_aarch64") for t in tags)
