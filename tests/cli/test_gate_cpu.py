"""A native class whose CPU this host does not have is refused before anything runs: one line, exit 2."""

from __future__ import annotations

import shutil

import pytest

from tiergate.cli.main import main
from tiergate.paths import targets_dir

SHIPPED = "x86_64-cpu-onnxruntime"


def _catalogue(tmp_path, name: str, cpu_table: str):
    folder = tmp_path / "targets"
    folder.mkdir(exist_ok=True)
    text = (targets_dir() / f"{SHIPPED}.toml").read_text()
    start = text.index("[cpu]")
    end = text.index("\n[", start) + 1
    (folder / f"{name}.toml").write_text(text[:start] + cpu_table + "\n" + text[end:])
    shutil.copy(targets_dir() / f"{SHIPPED}.toml", folder / f"{SHIPPED}.toml")
    return folder


def _gate(capsys, monkeypatch, folder, name):
    monkeypatch.setenv("TIERGATE_TARGETS_DIR", str(folder))
    code = main(["gate", "-c", "a.onnx", "-r", "b.onnx", "-d", "d.npz", "-t", name])
    return code, capsys.readouterr().err


def test_a_required_feature_the_host_lacks_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from tiergate import targets

    # the host's CPU pinned (an x86 feature name the harness reads; an arm64 one is refused at load: issue 42)
    monkeypatch.setattr(targets.host, "host_cpu", lambda: ("Test CPU", frozenset({"sse2", "avx2", "fma"})))
    folder = _catalogue(tmp_path, "fp16-box", '[cpu]\nrequires = ["avx2", "avx512_fp16"]')
    code, err = _gate(capsys, monkeypatch, folder, "fp16-box")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("tiergate: error: device class fp16-box: this host's CPU lacks avx512_fp16, which the "
                          "device has")


def test_a_feature_the_device_lacks_on_the_host_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    folder = _catalogue(tmp_path, "no-sse2-box", '[cpu]\nlacks = ["sse2"]')          # every x86_64 host has sse2
    code, err = _gate(capsys, monkeypatch, folder, "no-sse2-box")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "device class no-sse2-box: this host's CPU has sse2, which the device lacks" in err
    assert 'on_mismatch = "emulate"' in err                                            # what to do instead


@pytest.mark.emulated          # the QEMU scripts/setup installs: its own list of CPU models
def test_a_misspelt_cpu_feature_or_an_unknown_qemu_cpu_is_one_line_exit_2_at_load(tmp_path, capsys, monkeypatch):
    """Issue 42: `lacks = ["avx512vnni"]` was silently never present; `emulated_cpu = "cortex-z99"` made both runs
    fail in QEMU and REJECTed the candidate (exit 1). Both are refused where the class is loaded, naming the
    closest known name (the harness's feature names; the list of the QEMU scripts/setup installs)."""
    arm = (targets_dir() / "arm64-cpu-onnxruntime.toml").read_text().replace('"cortex-a76"', '"cortex-z99"')
    folder = _catalogue(tmp_path, "typo-box", '[cpu]\nrequires = ["avx2"]\nlacks = ["avx512vnni"]')
    code, err = _gate(capsys, monkeypatch, folder, "typo-box")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "'cpu.lacks'" in err and "avx512vnni" in err and "did you mean avx512_vnni?" in err
    (folder / "typo-box.toml").unlink()
    (folder / "z99-box.toml").write_text(arm.replace('name = "arm64-cpu-onnxruntime"', 'name = "z99-box"'))
    code, err = _gate(capsys, monkeypatch, folder, "z99-box")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "'emulated_cpu'" in err and "cortex-z99" in err and "qemu-aarch64" in err and "cortex-a76" in err
