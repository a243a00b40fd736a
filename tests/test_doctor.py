"""tiergate doctor: real checks on this machine, and a clear exit 2 without an engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tiergate import doctor
from tiergate.cli.main import main

TIERGATE = [sys.executable, "-m", "tiergate.cli.main"]


def test_no_engine_exits_2_with_one_line_hint(tmp_path):
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(TIERGATE + ["doctor"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    err_lines = proc.stderr.strip().splitlines()
    assert len(err_lines) == 1, proc.stderr
    assert "docker engine" in err_lines[0] and "fix:" in err_lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "docker engine" in proc.stdout and "fail" in proc.stdout
    # rows that need the engine are skipped, not failed, so the one fix is the engine
    assert proc.stdout.count("fail") == 1


def test_binfmt_entry_without_flag_f_fails(tmp_path):
    entry = tmp_path / "qemu-aarch64"
    entry.write_text("enabled\ninterpreter /bin/true\nflags: OC\noffset 0\n")
    check = doctor.check_emulation_registration(entry)
    assert check.failed and "flag F" in check.detail and check.fix


def test_missing_binfmt_entry_fails(tmp_path):
    check = doctor.check_emulation_registration(tmp_path / "absent")
    assert check.failed and "scripts/setup" in check.fix


def test_disk_check_reports_free_space(tmp_path, monkeypatch):
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    monkeypatch.setattr(doctor, "MIN_FREE_GB", 0.0)
    roomy = doctor.check_disk(tmp_path)
    assert roomy.status == "ok" and roomy.detail.endswith(f"GB free at {tmp_path}")
    assert float(roomy.detail.split()[0]) == pytest.approx(free_gb, abs=1.0)   # other writers may move it a little
    monkeypatch.setattr(doctor, "MIN_FREE_GB", free_gb + 1000)
    short = doctor.check_disk(tmp_path)
    assert short.status == "fail" and "GB free" in short.detail and "docker image prune" in short.fix


@pytest.mark.docker
@pytest.mark.emulated
def test_doctor_passes_on_a_set_up_machine(capsys):
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    rows = {row["name"]: row for row in report["checks"]}
    assert code == 0 and report["ok"] is True
    assert rows["docker engine"]["status"] == "ok"
    assert rows["arm64 emulation"]["status"] == "ok" and "QEMU" in rows["arm64 emulation"]["detail"]
    assert rows["arm64 container"]["status"] == "ok"  # uname -m in an arm64 container said aarch64
    for tag in doctor.BASE_IMAGES:
        assert rows[f"image {tag}"]["status"] == "ok"
    assert rows["gpu"]["status"] == ("ok" if shutil.which("nvidia-smi") else "warn")   # a GPU is optional


@pytest.mark.docker
@pytest.mark.emulated
def test_doctor_table_on_a_set_up_machine(capsys):
    code = main(["doctor"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert "tiergate doctor" in out
    for name in ("docker engine", "arm64 emulation", "arm64 container", "free disk"):
        line = next(ln for ln in out.splitlines() if name in ln)
        assert "ok" in line and "fail" not in line


def test_an_unusable_home_is_the_disk_checks_failure(monkeypatch, tmp_path):
    """A TIERGATE_HOME under /proc (or a file) is reported as a failed check, not a crash of the doctor."""
    from tiergate.doctor import check_disk

    (tmp_path / "a-file").write_text("")
    for bad in ("/proc/tiergate-home", str(tmp_path / "a-file")):
        monkeypatch.setenv("TIERGATE_HOME", bad)
        check = check_disk()
        assert check.status == "fail" and bad in check.detail and "TIERGATE_HOME" in check.fix


# -- the emulated tiers' background setup (make demo: scripts/setup --demo) ----------------------------------------
def test_the_demo_waits_for_the_background_setup_then_goes_on(tmp_path, monkeypatch):
    """The demo's emulated tiers wait while scripts/setup --emulated works in the background, with progress lines
    naming its last step, and go on once emulation answers."""
    import time

    monkeypatch.setenv("TIERGATE_SYSTEM_DIR", str(tmp_path))
    (tmp_path / doctor.SETUP_STATUS).write_text(f"running 4242 {int(time.time()) - 30}\n")
    (tmp_path / doctor.SETUP_LOG).write_text("setup: images: bootstrapping tiergate/base:bookworm-arm64 with "
                                              "debootstrap: 40 s so far, about 150 s left\n")
    answers = iter([False, False, True])
    monkeypatch.setattr(doctor, "emulation_ready", lambda client=None: next(answers))
    said = []
    doctor.wait_for_emulation(said.append, poll_s=0)
    assert len(said) == 1 and "waiting for the emulated tiers' setup (3" in said[0]
    assert "bootstrapping tiergate/base:bookworm-arm64" in said[0]


@pytest.mark.parametrize("status, message", [
    ("failed debootstrap arm64 failed", "the emulated tiers' setup failed (debootstrap arm64 failed)"),
    (None, "the emulated tiers are not set up here"),
])
def test_a_failed_or_missing_background_setup_is_one_environment_error(tmp_path, monkeypatch, status, message):
    from tiergate.errors import EnvironmentProblem

    monkeypatch.setenv("TIERGATE_SYSTEM_DIR", str(tmp_path))
    if status is not None:
        (tmp_path / doctor.SETUP_STATUS).write_text(status)
    monkeypatch.setattr(doctor, "emulation_ready", lambda client=None: False)
    with pytest.raises(EnvironmentProblem, match=message.replace("(", r"\(").replace(")", r"\)")):
        doctor.wait_for_emulation(lambda _text: None, poll_s=0)
