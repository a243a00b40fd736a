"""Issue 42's attacker's pass, the CLI's files (the orchestrator on the in-memory fakes: no Docker): every input a
gate names is read only when it is a regular file (a FIFO as --data hung the gate for ever, /dev/zero never
ended); every file it writes (--report-dir, --junit, --attest) is written whole through a new temporary file and
renamed over its place, never through a link planted there; a cache key kept inside the home is no key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gatekit
import tiergate
from fakes import FakeBackend, FakeBuilder
from tiergate.cli.main import main

X86 = "x86_64-cpu-onnxruntime"
SRC = str(Path(tiergate.__file__).resolve().parents[1])


@pytest.fixture
def pair(tmp_path, tiergate_home):
    cand, ref, data = gatekit.tiny_pair(tmp_path)
    return {"c": cand, "r": ref, "d": data, "tmp": tmp_path}


def test_inputs_that_are_not_regular_files_are_one_line_never_a_hang(pair, tiergate_home):
    os.mkfifo(pair["tmp"] / "fifo")
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base = ["gate", "-c", str(pair["c"]), "-r", str(pair["r"]), "-d", str(pair["d"]), "-t", X86]
    for args, says in ((["-d", str(pair["tmp"] / "fifo")], "evaluation data"),
                       (["--policy", str(pair["tmp"] / "fifo")], "policy"),
                       (["--incumbent", "/dev/zero"], "incumbent")):
        proc = subprocess.run([sys.executable, "-m", "tiergate.cli.main", *base, *args], env=env, capture_output=True,
                              text=True, timeout=60)
        lines = [line for line in proc.stderr.splitlines() if line.startswith("tiergate: error:")]
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0] and "not a regular file" in lines[0], \
            (args, proc.stderr)


def test_the_files_a_gate_writes_are_never_written_through_a_planted_link(pair, monkeypatch, capsys):
    gatekit.fake_cli_seams(monkeypatch, FakeBuilder(), FakeBackend())
    report = pair["tmp"] / "report"
    report.mkdir()
    victims = [pair["tmp"] / f"victim-{i}" for i in range(3)]
    for victim, link in zip(victims, (report / "gate-summary.md", report / "gate-decision.json",
                                      pair["tmp"] / "junit.xml")):
        victim.write_text("precious")
        link.symlink_to(victim)
    code = main(["gate", "-c", str(pair["c"]), "-r", str(pair["r"]), "-d", str(pair["d"]), "-t", X86, "--report-dir",
                 str(report), "--junit", str(pair["tmp"] / "junit.xml"), "--json"])
    out = capsys.readouterr().out
    assert code in (0, 3) and all(victim.read_text() == "precious" for victim in victims), capsys.readouterr()
    for path in (report / "gate-summary.md", report / "gate-decision.json", pair["tmp"] / "junit.xml"):
        assert not path.is_symlink() and path.stat().st_size > 0
    assert json.loads((report / "gate-decision.json").read_text())["verdict"] == json.loads(out)["verdict"]
    assert not [p for p in pair["tmp"].rglob("*.part")]


def test_a_cache_key_inside_the_home_is_no_key(pair, monkeypatch, capsys, tiergate_home):
    gatekit.fake_cli_seams(monkeypatch, FakeBuilder(), FakeBackend())
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(tiergate_home / "keys" / "cache.key"))
    args = ["gate", "-c", str(pair["c"]), "-r", str(pair["r"]), "-d", str(pair["d"]), "-t", X86, "--json"]
    main(args)
    err = capsys.readouterr().err
    assert "inside TIERGATE_HOME" in err and not (tiergate_home / "keys").exists()
    assert not list(tiergate_home.glob("decisions/*.json"))            # nothing sealed, nothing cached
