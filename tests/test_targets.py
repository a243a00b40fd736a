"""The device-class catalogue: the shipped files load, bad files name the file and the field."""

from __future__ import annotations

import pytest

from tiergate import targets
from tiergate.errors import InputError

REQUIRED = ["x86_64-cpu-onnxruntime", "x86_64-cpu-tflite", "arm64-cpu-onnxruntime",
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
])
def test_bad_file_names_file_and_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        targets.catalogue(tmp_path)
    assert str(path) in err.value.message and f"'{field}'" in err.value.message


def test_unknown_class_lists_known_ones():
    with pytest.raises(InputError) as err:
        targets.resolve("x86_64-cpu-onnxruntime,no-such-class")
    assert "no-such-class" in err.value.message and "arm64-cpu-tflite" in err.value.message
