"""Issue 42: the machine-wide lease folder can no longer be planted by another local user. A folder owned by
someone else (not root with the sticky bit) is refused: a gate warns and holds no lease there, gc removes no image
(exit 2, one line); lock files are opened without following links and without blocking, and never chmod-ed unless
made here: a link planted as gc.lock cannot make this user's signing key world-readable, a FIFO cannot hang gc."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import tiergate
from tiergate import leases
from tiergate.cli.main import main

SRC = str(Path(tiergate.__file__).resolve().parents[1])
NOBODY = 65534

pytestmark = pytest.mark.root          # planting a folder as another user (strict: tests/conftest.py)


def _victim(tmp_path) -> Path:
    key = tmp_path / "signing"
    key.write_text("-----BEGIN PRIVATE KEY-----\nsecret\n")
    key.chmod(0o600)
    return key


def _gc(env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    return subprocess.run([sys.executable, "-m", "tiergate.cli.main", "gc", "--older-than", "3650d"], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_folder_planted_by_another_user_is_refused(tmp_path, monkeypatch, capsys):
    victim = _victim(tmp_path)
    planted = tmp_path / "leases"
    planted.mkdir()
    planted.chmod(0o1777)
    os.chown(planted, NOBODY, NOBODY)
    (planted / "gc.lock").symlink_to(victim)
    os.lchown(planted / "gc.lock", NOBODY, NOBODY)
    proc = _gc({"TIERGATE_HOME": str(tmp_path / "home"), leases.ENV: str(planted)})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tiergate: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "owned by uid 65534" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and victim.read_text().endswith("secret\n")
    monkeypatch.setenv(leases.ENV, str(planted))
    with leases.holding():                       # what a gate does: it warns and leases nothing there
        leases.add("sha256:" + "ab" * 32)
    assert "cannot hold an image lease" in capsys.readouterr().err
    assert sorted(p.name for p in planted.iterdir()) == ["gc.lock"]
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_in_a_trusted_folder_planted_lock_files_are_never_followed_nor_waited_on(tmp_path, monkeypatch, capsys):
    victim = _victim(tmp_path)
    shared = tmp_path / "shared"                  # root's and sticky, as /tmp: anyone may add files
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "gc.lock").symlink_to(victim)
    digest = __import__("hashlib").sha256(b"local\0tiergate/x:1").hexdigest()[:32]
    (shared / f"build-{digest}.buildlock").symlink_to(victim)
    os.mkfifo(shared / "someone.lock")            # a "lease" whose probe would block for ever
    monkeypatch.setenv(leases.ENV, str(shared))
    with leases.using_images(), leases.building("local", "tiergate/x:1"):    # a gate's locks: no chmod through
        pass
    assert "unusable" in capsys.readouterr().err
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    proc = _gc({"TIERGATE_HOME": str(tmp_path / "home"), leases.ENV: str(shared)})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tiergate: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "gc.lock" in errors[0], proc.stderr
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    (shared / "gc.lock").unlink()
    proc = _gc({"TIERGATE_HOME": str(tmp_path / "home"), leases.ENV: str(shared)})   # no FIFO hang (the engine listed)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((shared / "gc.lock").stat().st_mode) == 0o644 and not (shared / "gc.lock").is_symlink()
