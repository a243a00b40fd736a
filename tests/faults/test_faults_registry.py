"""Registry faults: honest, idempotent registration; unreadable registries; concurrency; a lost store blob.

Concurrency cases run on SQLite + a folder and on a real PostgreSQL server + S3 (moto).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from faultkit import ARM, X86, cli, error_lines
from backends import BACKENDS, open_registry
from fakes import FakeBackend, FakeBuilder
import gatekit
from tiergate import orchestrator
from tiergate.policy import load_policy
from tiergate.registry import Registry, count_rows, register_artifact
from tiergate.targets import resolve

pytestmark = pytest.mark.faults
SQL_WORDS = ("SELECT", "INSERT", "UPDATE", "CREATE TABLE", "[parameters", "[SQL")


def _reg_args(case, artifact, reference, *extra):
    db = case["tmp"] / "reg" / "registry.db"
    return ("register", str(artifact), "--model", "m", "--reference", str(reference),
            "--registry", f"sqlite:///{db}", "--store", str(case["tmp"] / "store"), *extra)


def test_registering_again_merges_tags(case):
    env = {"TIERGATE_HOME": str(case["home"])}
    assert cli(*_reg_args(case, case["good"], case["reference"], "--tag", "a=1"), env=env)[0] == 0
    code, out, err = cli(*_reg_args(case, case["good"], case["reference"], "--tag", "b=2", "--json"), env=env)
    assert code == 0, err
    assert json.loads(out)["tags"] == {"a": "1", "b": "2"}
    with Registry(f"sqlite:///{case['tmp'] / 'reg' / 'registry.db'}", case["tmp"] / "store") as reg:
        assert reg.artifacts("m")[-1].tags == {"a": "1", "b": "2"} or any(a.tags == {"a": "1", "b": "2"}
                                                                          for a in reg.artifacts("m"))
        assert count_rows(reg)["artifacts"] == 2


def test_a_changed_reference_is_refused(case):
    env = {"TIERGATE_HOME": str(case["home"])}
    assert cli(*_reg_args(case, case["good"], case["reference"]), env=env)[0] == 0
    code, out, err = cli(*_reg_args(case, case["good"], case["bad"]), env=env)   # bad: another FP32 model
    assert code == 2 and out == ""
    assert len(error_lines(err)) == 1 and "is registered with reference" in err and "cannot change" in err
    with Registry(f"sqlite:///{case['tmp'] / 'reg' / 'registry.db'}", case["tmp"] / "store") as reg:
        good = [a for a in reg.artifacts("m") if a.filename == "good.onnx"][0]
        assert reg.find_artifact(good.reference_sha).filename == "ref.onnx"   # the old link is kept


def test_a_reference_in_the_other_format_is_refused(case, tmp_path):
    import modelkit

    if modelkit.tflite_extra_problem():
        pytest.skip(modelkit.tflite_extra_problem())
    pair = modelkit.tflite_mlp_pair(tmp_path)
    tfl = pair.get("fp32") or next(iter(pair.values()))
    code, out, err = cli(*_reg_args(case, case["good"], tfl), env={"TIERGATE_HOME": str(case["home"])})
    assert code == 2 and "the reference is tflite but the artifact is onnx" in err
    assert not (case["tmp"] / "store").exists() or not any((case["tmp"] / "store").rglob("model.*"))


def test_an_unwritable_store_is_a_clear_error(case):
    code, out, err = cli(*_reg_args(case, case["good"], case["reference"])[:-2], "--store", "/proc/nope",
                         env={"TIERGATE_HOME": str(case["home"])})
    assert code == 2 and "stored at" not in out
    assert error_lines(err) and "store /proc/nope: cannot write there" in err


@pytest.mark.parametrize("damage, message", [
    ("zero", "is empty (0 bytes), not a registry"),
    ("corrupt", "file is not a database"),
    ("readonly", "readonly database"),
])
def test_an_unusable_registry_is_one_line_naming_the_file(case, damage, message):
    db = case["tmp"] / "reg" / "registry.db"
    env = {"TIERGATE_HOME": str(case["home"])}
    assert cli(*_reg_args(case, case["good"], case["reference"]), env=env)[0] == 0
    if damage == "zero":
        db.write_bytes(b"")
    elif damage == "corrupt":
        db.write_bytes(b"garbage " * 512)
    elif os.geteuid() == 0:     # root writes through file modes: a read-only bind mount of the folder
        if subprocess.run(["mount", "--bind", "-o", "ro", str(db.parent), str(db.parent)]).returncode != 0:
            from partskit import missing_part

            missing_part("read-only mount", "cannot make a read-only bind mount here")
    else:
        os.chmod(db, 0o444)
        os.chmod(db.parent, 0o555)
    try:
        code, out, err = cli(*_reg_args(case, case["bad"], case["reference"]), env=env)
    finally:
        if damage == "readonly" and os.geteuid() == 0:
            subprocess.run(["umount", str(db.parent)])
        os.chmod(db.parent, 0o755)
    assert code == 2, err
    assert len(error_lines(err)) == 1 and str(db) in err and message in err
    assert not any(word in err for word in SQL_WORDS) and "internal error" not in err
    if damage == "zero":
        assert db.stat().st_size == 0                      # not silently recreated


# --- concurrency on both backends ---------------------------------------------------------------------
_REGISTER = textwrap.dedent("""
    import sys
    from tiergate.registry import Registry, register_artifact
    url, store, art, ref, tag = sys.argv[1:]
    with Registry(url, store) as reg:
        register_artifact(reg, art, model="m", reference=ref, tags={tag: "1"})
""")

_DECIDE = textwrap.dedent("""
    import json, sys
    from tiergate.registry import Registry, record_gate_decision
    url, store, sha, decision = sys.argv[1:]
    with Registry(url, store) as reg:
        record_gate_decision(reg, sha, json.loads(open(decision).read()), reuse_same=True)
""")


def _parallel(script: str, argvs: list[list[str]]) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, *argv], env=env, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err


@pytest.mark.slow
@pytest.mark.parametrize("kind", BACKENDS)
def test_concurrent_registrations_and_decisions_record_once(request, kind, case, tmp_path):
    with open_registry(request, kind, tmp_path) as reg:
        url, store = reg.url, reg.store.location
        _parallel(_REGISTER, [[url, store, str(case["good"]), str(case["reference"]), f"t{i}"] for i in range(6)])
        rows = count_rows(reg)
        assert rows["artifacts"] == 2
        good = [a for a in reg.artifacts("m") if a.filename == "good.onnx"][0]
        assert good.tags == {f"t{i}": "1" for i in range(6)}
        run, _, _ = _gate_fakes(case)
        decision = tmp_path / "decision.json"
        decision.write_text(json.dumps(run.decision.to_json()))
        _parallel(_DECIDE, [[url, store, good.sha256, str(decision)] for _ in range(6)])
        assert len(reg.decisions(artifact_sha=good.sha256)) == 1
        moves = reg.alias_history("m")
        assert run.decision.verdict == "PROMOTE" and len(moves) == len({m.tier for m in moves}) >= 1


def _gate_fakes(case, registry=None, backend=None):
    backend = backend or FakeBackend()
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend, janitor=lambda dcs: None)
    run = gatekit.gate(case["good"], case["reference"], case["data"], resolve([X86, ARM]), load_policy(None),
                        seams=seams, registry=registry)
    return run, backend, seams


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_missing_store_blob_of_a_recorded_run_is_run_again(request, kind, case, tmp_path):
    with open_registry(request, kind, tmp_path) as reg:
        register_artifact(reg, case["good"], model="m", reference=case["reference"])
        first, _, _ = _gate_fakes(case, registry=reg)
        orchestrator.record_or_reuse(reg, first)
        shutil.rmtree(case["home"] / "runs")               # only the registry remembers the runs now
        for run in reg.runs():
            reg.store.remove(run.result_key)               # ... and their stored blobs are gone
        again, backend, _ = _gate_fakes(case, registry=reg)
        assert again.decision.verdict == first.decision.verdict == "PROMOTE"
        assert ("candidate", X86) in backend.runs          # run again, not failed
        assert count_rows(reg)["artifacts"] == 2
