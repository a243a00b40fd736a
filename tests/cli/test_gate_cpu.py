"""A native class whose CPU this host does not have is refused before anything runs: one line, exit 2."""

from __future__ import annotations

import shutil

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
    folder = _catalogue(tmp_path, "sve-box", '[cpu]\nrequires = ["avx2", "sve"]')    # sve: an arm64 feature
    code, err = _gate(capsys, monkeypatch, folder, "sve-box")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("tiergate: error: device class sve-box: this host's CPU lacks sve, which the device has")


def test_a_feature_the_device_lacks_on_the_host_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    folder = _catalogue(tmp_path, "no-sse2-box", '[cpu]\nlacks = ["sse2"]')          # every x86_64 host has sse2
    code, err = _gate(capsys, monkeypatch, folder, "no-sse2-box")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "device class no-sse2-box: this host's CPU has sse2, which the device lacks" in err
    assert 'on_mismatch = "emulate"' in err                                            # what to do instead
