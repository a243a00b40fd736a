"""The run key holds the device class's whole effective settings: a run made under one memory limit (threads,
batch, timeout, evaluation...) is never reused after the class changes it; what cannot change a run is left out."""

from __future__ import annotations

import dataclasses

import pytest

import gatekit
from fakes import FakeBackend, FakeBuilder
from tiergate import orchestrator
from tiergate.policy import load_policy
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture
def case(tmp_path, linear_set, tiergate_home):
    _, w, write = linear_set(3)
    return {"reference": write("ref.onnx", w), "candidate": write("cand.onnx", w + 1e-4), "data": tmp_path / "eval.npz"}


def _gate(case, dc, backend):
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
    return gatekit.gate(case["candidate"], case["reference"], case["data"], [dc], load_policy(None), seams=seams)


def _with_limits(dc, **limits):
    return dataclasses.replace(dc, limits=dataclasses.replace(dc.limits, **limits))


def test_a_run_made_under_one_memory_limit_is_not_reused_after_the_class_lowers_it(case):
    roomy = _with_limits(resolve(X86)[0], memory="2048m")
    first = _gate(case, roomy, FakeBackend())
    assert first.decision.verdict == "PROMOTE", first.decision.reasons
    tight = _with_limits(roomy, memory="24m")
    backend = FakeBackend(oom={X86: 24})          # what the engine does under 24 MiB
    second = _gate(case, tight, backend)
    assert sorted(backend.runs) == [("candidate", X86), ("reference", X86)]      # ran again, nothing reused
    assert second.cache_hits == 0 and second.decision.verdict == "REJECT"
    assert any(c.name == "memory_limit" and not c.passed for c in second.decision.checks)


def test_every_setting_that_can_change_a_run_is_in_the_key_and_nothing_else():
    from tiergate.orchestrator.running import class_settings

    dc = resolve(X86)[0]
    base = class_settings(dc)
    changed = [
        _with_limits(dc, memory="24m"), _with_limits(dc, timeout_s=5), _with_limits(dc, pids_limit=8),
        dataclasses.replace(dc, threads=dc.threads + 1), dataclasses.replace(dc, batch_size=dc.batch_size + 1),
        dataclasses.replace(dc, runtime_version="0.0.1"), dataclasses.replace(dc, base_image="other:1"),
        dataclasses.replace(dc, evaluation=dataclasses.replace(dc.evaluation, batch=dc.evaluation.batch + 8)),
        dataclasses.replace(dc, evaluation=dataclasses.replace(dc.evaluation, latency_calls=3)),
        dataclasses.replace(dc, docker_host="ssh://u@elsewhere"),
    ]
    keys = [class_settings(c) for c in changed]
    assert base not in keys and len(set(keys)) == len(keys)
    same = [dataclasses.replace(dc, cost_per_hour=99.0), dataclasses.replace(dc, description="another text"),
            dataclasses.replace(dc, cost_tags={"team": "x"}),
            dataclasses.replace(dc, evaluation=dataclasses.replace(dc.evaluation, shards=3))]
    assert {class_settings(c) for c in same} == {base}


def test_a_run_recorded_in_a_registry_is_fetched_only_under_the_same_settings(case, tmp_path, monkeypatch):
    from tiergate.registry import Registry, register_artifact

    roomy = _with_limits(resolve(X86)[0], memory="2048m")
    with Registry(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path / "store") as registry:
        register_artifact(registry, case["candidate"], model="clf", reference=case["reference"])
        seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=FakeBackend())
        run = gatekit.gate(case["candidate"], case["reference"], case["data"], [roomy], load_policy(None),
                           seams=seams, registry=registry)
        orchestrator.record(registry, run)
        for home, dc, runs in (("same", roomy, 0), ("tight", _with_limits(roomy, memory="24m"), 1)):
            monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / home))     # another machine, the shared registry
            backend = FakeBackend(oom={X86: 24}) if runs else FakeBackend()
            seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
            again = gatekit.gate(case["candidate"], case["reference"], case["data"], [dc], load_policy(None),
                                 seams=seams, registry=registry)
            assert backend.runs.count(("candidate", X86)) == runs, home      # the registry records the candidate's
            assert again.decision.verdict == ("REJECT" if runs else "PROMOTE")
