"""The counting QEMU built when first needed (issue 44): `make demo` leaves it out, a gate whose policy asks for
instructions on an emulated class builds it once, saying so with its expected time, before any run; where it
cannot be built the gate exits 2 (an environment fault), never a verdict."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from tiergate.errors import EnvironmentProblem
from tiergate.execution import counting
from tiergate.targets import resolve

FILES = ("ld-linux-x86-64.so.2", "qemu-aarch64", "qemu-x86_64", "libtiergate_count.so")


def _checkout(root: Path, body: str) -> Path:
    """A checkout whose scripts/build-counting-qemu is `body` (a real script, run as setup would run it)."""
    (root / "scripts").mkdir(parents=True)
    script = root / "scripts" / "build-counting-qemu"
    script.write_text("#!/bin/sh\nset -e\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _installs(calls: Path) -> str:
    """A build that counts its calls and installs the files counting.counter() looks for."""
    files = " ".join(FILES)
    return (f'echo built >> {calls}\nsleep 0.3\nd="$TIERGATE_SYSTEM_DIR/qemu-plugins"\nmkdir -p "$d"\n'
            f'for f in {files}; do : > "$d/$f"; done\necho "qemu test" > "$d/STAMP"\n')


@pytest.fixture()
def system(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERGATE_SYSTEM_DIR", str(tmp_path / "system"))
    monkeypatch.delenv(counting.OFF_ENV, raising=False)
    if os.geteuid() != 0:
        pytest.fail("these tests run the build as root does (scripts/setup's machine)")
    return tmp_path


def test_a_policy_s_instructions_build_the_counting_qemu_once_saying_so(system, monkeypatch):
    calls = system / "calls"
    script = _checkout(system / "co", _installs(calls))
    monkeypatch.setattr(counting, "build_script", lambda: script)
    arm, x86 = resolve("arm64-cpu-onnxruntime,x86_64-cpu-onnxruntime")
    assert counting.counter() is None and counting.needs_build([arm, x86]) == [arm]
    said: list[str] = []
    gates = [threading.Thread(target=counting.ensure_built, args=([arm], said.append)) for _ in range(2)]
    for gate in gates:
        gate.start()
    for gate in gates:
        gate.join()
    assert calls.read_text() == "built\n"                       # two gates at once: one build
    assert len(said) == 1 and "arm64-cpu-onnxruntime" in said[0] and f"about {counting.BUILD_SECONDS // 60} min" in said[0], said
    assert counting.counter() is not None and counting.needs_build([arm]) == []
    counting.ensure_built([arm], said.append)                   # built: nothing more to say
    assert len(said) == 1


def test_a_native_class_or_counting_switched_off_builds_nothing(system, monkeypatch):
    script = _checkout(system / "co", "exit 1\n")
    monkeypatch.setattr(counting, "build_script", lambda: script)
    arm, x86 = resolve("arm64-cpu-onnxruntime,x86_64-cpu-onnxruntime")
    counting.ensure_built([x86], pytest.fail)
    monkeypatch.setenv(counting.OFF_ENV, "1")
    counting.ensure_built([arm], pytest.fail)


def test_a_build_that_fails_is_one_environment_error(system, monkeypatch):
    script = _checkout(system / "co", "echo no compiler; exit 3\n")
    monkeypatch.setattr(counting, "build_script", lambda: script)
    (arm,) = resolve("arm64-cpu-onnxruntime")
    with pytest.raises(EnvironmentProblem, match=r"could not be built here \(exit 3; see .*counting-qemu.log\)"):
        counting.ensure_built([arm], lambda text: None)
    monkeypatch.setattr(counting, "build_script", lambda: system / "no-checkout" / "build-counting-qemu")
    with pytest.raises(EnvironmentProblem, match="not set up on this machine"):
        counting.ensure_built([arm], lambda text: None)


def test_a_gate_asking_for_instructions_where_none_can_be_built_exits_2_before_any_run(system, monkeypatch, capsys):
    """Through the CLI: the policy's instructions limit on the emulated class, a build that fails: exit 2 with one
    line, not a REJECT 'not measured' (nothing built or run: no engine is needed for this)."""
    import numpy as np

    import modelkit
    from tiergate.cli.main import main

    script = _checkout(system / "co", "exit 1\n")
    monkeypatch.setattr(counting, "build_script", lambda: script)
    monkeypatch.setenv("TIERGATE_HOME", str(system / "home"))
    model, other = modelkit.write(modelkit.mlp(), system / "m.onnx"), modelkit.write(modelkit.mlp(seed=1), system / "c.onnx")
    np.savez(system / "d.npz", x=np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32))
    (system / "p.toml").write_text("[defaults]\nmax_instructions_ratio = 1.05\n")
    code = main(["gate", "-c", str(other), "-r", str(model), "-d", str(system / "d.npz"), "-t",
                 "arm64-cpu-onnxruntime", "--policy", str(system / "p.toml")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("tiergate: error:")]
    assert len(lines) == 1 and "instruction-counting QEMU could not be built" in lines[0], err
    assert "Traceback" not in err
