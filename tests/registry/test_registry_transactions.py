"""A decision, its checks, its runs and its alias moves commit together or not at all (real SQLite file)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from registry_kit import add, at, make_onnx
from sqlalchemy import exc

from tiergate.registry import Check, NewRun, Registry, count_rows

RUN = NewRun(device_class="x86_64-cpu-onnxruntime", tier="x86-server", status="ok", image_id="sha256:i",
             data_sha256="d" * 64, metrics={"cosine": 0.9})


@pytest.fixture
def promoted(registry, tmp_path):
    """Two artifacts; the first already promoted on x86-server."""
    a = add(registry, make_onnx(tmp_path / "a.onnx", seed=1), at=at(0)).sha256
    b = add(registry, make_onnx(tmp_path / "b.onnx", seed=2), at=at(1)).sha256
    registry.record_decision(a, "promote", tiers=["x86-server"], runs=[RUN], checks=[Check("x86", "x86-server", "cosine", 0.99, None, ">=", True)])
    return registry, a, b


def _failing_checks(error: Exception):
    yield Check("x86", "x86-server", "cosine", 0.99, 0.98, ">=", True)
    raise error


def test_an_error_midway_leaves_nothing(promoted):
    registry, a, b = promoted
    before = count_rows(registry)
    with pytest.raises(RuntimeError, match="gate blew up"):
        registry.record_decision(b, "promote", tiers=["x86-server", "cortex-a"], runs=[RUN, RUN],
                                 checks=_failing_checks(RuntimeError("gate blew up")))
    assert count_rows(registry) == before
    assert registry.aliases("digits") == {"x86-server": a}


def test_a_database_error_midway_leaves_nothing(promoted):
    registry, a, b = promoted
    before = count_rows(registry)
    with pytest.raises(exc.IntegrityError):
        registry.record_decision(b, "promote", tiers=["x86-server"], runs=[RUN],
                                 checks=[Check("x86", "x86-server", "ok", None, None, "==", True), Check("x86", "x86-server", None, None, None, "==", True)])  # NOT NULL name
    assert count_rows(registry) == before
    assert registry.alias("digits", "x86-server").sha256 == a


def test_a_crash_midway_leaves_nothing(promoted, tmp_path):
    """The writing process dies (os._exit) after the decision row, before its checks and alias move."""
    registry, a, b = promoted
    before = count_rows(registry)
    script = textwrap.dedent(f"""
        import os
        from tiergate.registry import Check, NewRun, Registry
        registry = Registry({registry.url!r}, {registry.store.location!r})
        def checks():
            yield Check("x86", "x86-server", "cosine", 0.99, None, ">=", True)
            os._exit(17)
        run = NewRun("x86_64-cpu-onnxruntime", "x86-server", "ok", "sha256:i", "d" * 64)
        registry.record_decision({b!r}, "promote", tiers=["x86-server"], runs=[run], checks=checks())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 17, done.stderr
    with Registry(registry.url, registry.store.location) as fresh:
        assert count_rows(fresh) == before
        assert fresh.aliases("digits") == {"x86-server": a}
        if fresh.engine.dialect.name == "sqlite":
            with fresh.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        fresh.record_decision(b, "promote", tiers=["x86-server"])  # the lock was released
        assert fresh.aliases("digits") == {"x86-server": b}


def test_concurrent_promotions_keep_a_consistent_history(promoted):
    """Two processes promote alternately-chosen artifacts at once; every move names the alias it replaced."""
    registry, a, b = promoted
    script = textwrap.dedent(f"""
        import sys
        from tiergate.registry import Registry
        registry = Registry({registry.url!r}, {registry.store.location!r})
        sha = sys.argv[1]
        for _ in range(15):
            registry.record_decision(sha, "promote", tiers=["x86-server"])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, sha], stderr=subprocess.PIPE, text=True)
             for sha in (a, b)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    history = registry.alias_history("digits", "x86-server")
    assert len(history) == 31
    for earlier, later in zip(history, history[1:]):
        assert later.previous_sha == earlier.artifact_sha
    assert registry.alias("digits", "x86-server").sha256 == history[-1].artifact_sha


def test_two_processes_registering_the_same_bytes_both_succeed(registry, tmp_path):
    model = make_onnx(tmp_path / "same.onnx", seed=5)
    script = textwrap.dedent(f"""
        from pathlib import Path
        from tiergate.registry import Registry
        from tiergate.registry.store import file_sha256
        registry = Registry({registry.url!r}, {registry.store.location!r})
        path = Path({str(model)!r})
        for _ in range(5):
            record = registry.add_artifact(path, sha256=file_sha256(path), model="digits", format="onnx",
                                           precision="fp32", fingerprint={{}})
        print(record.sha256)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert {out.strip() for out, _ in outs} == {registry.find_artifact(outs[0][0].strip()).sha256}
    assert count_rows(registry)["artifacts"] == 1
    assert registry.store.exists(registry.find_artifact(outs[0][0].strip()).store_key)
