"""A user metric's identity covers its code: the local modules it imports (wherever they lie) and the files of its
folder. Change a helper it imports and the decision is made again (normal path) and not answered (fast path)."""

from __future__ import annotations

import sys
import textwrap

import pytest

import gatekit
from fakes import FakeBackend, FakeBuilder
from tiergate import orchestrator, quickgate
from tiergate.policy import load_policy
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture
def case(tmp_path, linear_set, tiergate_home, monkeypatch):
    monkeypatch.setenv("TIERGATE_CACHE_KEY", str(tmp_path / "cache.key"))
    _, w, write = linear_set(11)
    shared, mine = tmp_path / "shared", tmp_path / "metric"
    shared.mkdir(), mine.mkdir()
    (shared / "tg_helper_mod.py").write_text("SCALE = 1.0\n")
    (mine / "weights.json").write_text('{"w": 1}\n')
    (mine / "score.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(shared)!r})
        import numpy as np
        import tg_helper_mod

        def agreement(outputs, labels):
            return float(tg_helper_mod.SCALE * np.mean(outputs["probs"].argmax(-1) == labels))
        """))
    yield {"reference": write("ref.onnx", w), "candidate": write("cand.onnx", w + 1e-4), "data": tmp_path / "eval.npz",
           "shared": shared, "mine": mine, "metric": f"{mine / 'score.py'}:agreement"}
    sys.modules.pop("tg_helper_mod", None)
    sys.path[:] = [p for p in sys.path if p != str(shared)]


def _gate(case):
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=FakeBackend())
    return gatekit.gate(case["candidate"], case["reference"], case["data"], resolve(X86), load_policy(None),
                        seams=seams, metrics=[case["metric"]])


def test_a_changed_helper_the_metric_imports_is_a_new_decision(case):
    first = _gate(case)
    assert first.decision.verdict == "PROMOTE", first.decision.reasons
    assert _gate(case).decision_cached                               # unchanged: from the cache
    (case["shared"] / "tg_helper_mod.py").write_text("SCALE = 0.5\n")    # the helper, in another folder
    assert not _gate(case).decision_cached
    assert _gate(case).decision_cached
    (case["mine"] / "weights.json").write_text('{"w": 2}\n')      # a file beside the metric
    assert not _gate(case).decision_cached


def test_the_fast_path_checks_the_metric_code_against_the_files(case):
    from tiergate.hashing import metric_code_sha256

    run = _gate(case)
    spec = next(m for m in run_metrics(case) if m.kind == "custom")
    assert any(f.endswith("tg_helper_mod.py") for f in spec.code_files)
    identities = [m.identity for m in run_metrics(case)]
    request = gatekit.request(case["candidate"], case["reference"], case["data"], resolve(X86), load_policy(None),
                              metrics=[case["metric"]])
    assert quickgate.metric_code_matches(identities, request)
    (case["shared"] / "tg_helper_mod.py").write_text("SCALE = 0.25\n")
    assert not quickgate.metric_code_matches(identities, request)
    assert metric_code_sha256(case["mine"] / "score.py", spec.code_files) != spec.code_sha256
    assert run.decision_key


def run_metrics(case):
    return orchestrator.resolve_metrics([case["metric"]], load_policy(None))
