"""The orchestrator's logic with in-memory fakes of the builder and the backend (no Docker, milliseconds).

The real Docker/QEMU path has its own integration tests (tests/pipeline/test_gate_cli.py,
tests/execution, tests/flows); here: all targets pass, one target crashes, cache hits,
tampered caches, A/B with an incumbent, an engine gone, concurrent gates, registry recording.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import gatekit
from tiergate import orchestrator, results, state
from tiergate.errors import InfrastructureFault
from tiergate.policy import load_policy
from tiergate.targets import resolve

import modelkit
from fakes import FakeBackend, FakeBuilder

X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"


def _classifier(path, weights: np.ndarray):
    return modelkit.write(modelkit.linear(weights, softmax=True, output_name="probs"), path)


@pytest.fixture
def case(tmp_path, tiergate_home):
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    labels = (x @ w).argmax(1).astype(np.int64)
    data = tmp_path / "eval.npz"
    np.savez(data, x=x, labels=labels)
    return {
        "reference": _classifier(tmp_path / "ref.onnx", w),
        "good": _classifier(tmp_path / "good.onnx", w + rng.normal(0, 1e-4, w.shape)),
        "bad": _classifier(tmp_path / "bad.onnx", rng.normal(size=w.shape)),
        "data": data, "home": tiergate_home,
    }


def _gate(case, candidate="good", backend=None, builder=None, incumbent=None, registry=None):
    backend, builder = backend or FakeBackend(), builder or FakeBuilder()
    seams = orchestrator.Seams(builder=builder, backend_for=backend)
    # every sample on both tiers (--no-early-stop): these tests are about running, caching and deciding; the
    # early decision an emulated tier takes by default has its own (test_early_stop.py)
    run = gatekit.gate(case[candidate], case["reference"], case["data"], resolve([X86, ARM]), load_policy(None),
                       incumbent=case[incumbent] if incumbent else None, seams=seams, registry=registry,
                       early_stop=False)
    return run, backend, builder


def test_all_targets_pass(case):
    run, backend, builder = _gate(case)
    assert run.decision.verdict == "PROMOTE", run.decision.reasons
    assert sorted(backend.runs) == sorted((r, c) for r in ("candidate", "reference") for c in (X86, ARM))
    assert len(builder.calls) == 4 and run.containers_started == 4 and run.cache_hits == 0
    assert {c.device_class for c in run.decision.checks} == {X86, ARM}
    for folder in run.run_dirs.values():
        assert state.verified(folder)            # outputs hashed into result.json, and they match


def test_one_target_crash_keeps_the_siblings_and_names_the_tier(case):
    run, backend, _ = _gate(case, backend=FakeBackend(crash={("candidate", ARM)}))
    decision = run.decision
    assert decision.verdict == "REJECT"
    failed = [c for c in decision.checks if not c.passed]
    assert [(c.device_class, c.name) for c in failed] == [(ARM, "run")]
    assert "crashed (segfault)" in decision.reasons[0] and ARM in decision.reasons[0]
    assert all(c.passed for c in decision.checks if c.device_class == X86)
    assert results.load(run.run_dirs[("candidate", X86)]).ok          # the sibling's measurement is kept
    assert results.load(run.run_dirs[("reference", ARM)]).ok


def test_unchanged_rerun_is_a_cache_hit_with_the_same_decision(case):
    first, _, _ = _gate(case)
    second, backend, _ = _gate(case)
    assert backend.runs == [] and second.cache_hits == 4 and second.containers_started == 0
    assert second.decision_cached and not first.decision_cached
    assert second.decision.dumps() == first.decision.dumps()
    assert second.decision_key == first.decision_key


def test_a_failed_run_is_not_cached(case):
    _gate(case, backend=FakeBackend(crash={("candidate", ARM)}))
    again, backend, _ = _gate(case)
    assert backend.runs == [("candidate", ARM)] and again.decision.verdict == "PROMOTE"


def test_tampered_decision_cache_is_discarded(case, capsys):
    good, _, _ = _gate(case)
    bad, _, _ = _gate(case, candidate="bad")
    assert bad.decision.verdict == "REJECT"
    # copy the good candidate's cached decision over the bad one's: it names other inputs, so it is refused
    bad_path = state.decision_path(bad.decision_key)
    bad_path.write_text(state.decision_path(good.decision_key).read_text())
    again, _, _ = _gate(case, candidate="bad")
    assert again.decision.verdict == "REJECT" and not again.decision_cached
    assert "discarding the cached decision" in capsys.readouterr().err
    # a forged verdict inside a file that keeps the right inputs is refused too (the key is over the inputs)
    doc = json.loads(bad_path.read_text())
    doc["inputs"]["candidate"] = "0" * 64
    bad_path.write_text(json.dumps(doc))
    assert not _gate(case, candidate="bad")[0].decision_cached


def test_truncated_cached_outputs_are_run_again(case, capsys):
    first, _, _ = _gate(case)
    outputs = first.run_dirs[("candidate", X86)] / results.OUTPUTS_FILE
    outputs.write_bytes(outputs.read_bytes()[:100])
    second, backend, _ = _gate(case)
    assert backend.runs == [("candidate", X86)]
    assert second.decision.verdict == "PROMOTE" and "discarding the saved run" in capsys.readouterr().err


def test_incumbent_ab(case):
    run, backend, _ = _gate(case, incumbent="bad")
    assert len(backend.runs) == 6
    for dc in (X86, ARM):
        ab = run.decision.metrics[dc].ab
        assert ab is not None and ab.correctness == "labels"
        assert ab.accuracy_difference.estimate > 0.3              # the candidate is far better than the incumbent
    assert any(c.name == "noninferior_accuracy" and c.passed for c in run.decision.checks)


def test_engine_gone_is_an_infrastructure_fault_not_a_verdict(case, tiergate_home):
    with pytest.raises(InfrastructureFault, match="engine is gone"):
        _gate(case, backend=FakeBackend(engine_gone="Docker engine local does not answer"))
    assert not list((tiergate_home / "decisions").glob("*.json")) if (tiergate_home / "decisions").exists() else True


def test_build_failure_fails_that_class_only(case):
    run, backend, _ = _gate(case, builder=FakeBuilder(fail={ARM}))
    assert all(dc == X86 for _, dc in backend.runs)
    failed = {c.device_class for c in run.decision.checks if not c.passed}
    assert failed == {ARM} and "fake build of arm64" in " ".join(run.decision.reasons)


def test_environment_problem_at_build_raises_instead_of_a_verdict(case, tiergate_home):
    from tiergate.errors import EnvironmentProblem

    backend = FakeBackend()
    with pytest.raises(EnvironmentProblem, match="base image tiergate/nope is missing"):
        _gate(case, backend=backend, builder=FakeBuilder(environment="base image tiergate/nope is missing"))
    assert backend.runs == [] and not (tiergate_home / "decisions").exists()


def test_concurrent_gates_share_one_run_per_input(case):
    backend = FakeBackend()
    verdicts = []

    def one():
        verdicts.append(_gate(case, backend=backend)[0].decision.verdict)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert verdicts == ["PROMOTE"] * 4
    assert sorted(backend.runs) == sorted((r, c) for r in ("candidate", "reference") for c in (X86, ARM))


def test_registry_records_decision_and_runs_in_one_transaction(case, monkeypatch):
    from tiergate.registry import Registry, register_artifact

    with Registry() as registry:
        register_artifact(registry, case["good"], model="clf", reference=case["reference"])
        run, _, _ = _gate(case, registry=registry)
        record = orchestrator.record(registry, run)
        assert record.verdict == "promote" and len(record.run_ids) == 2
        assert registry.alias("clf", "x86-server").sha256 == run.intakes["candidate"].sha256
        # a failure in the middle of recording leaves nothing behind
        register_artifact(registry, case["bad"], model="clf", reference=case["reference"])
        bad, _, _ = _gate(case, candidate="bad", registry=registry)
        before = (len(registry.decisions()), len(registry.runs()))
        calls = {"n": 0}
        real_put = registry.store.put_result

        def put_then_fail(folder):
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError("disk full")
            return real_put(folder)

        monkeypatch.setattr(registry.store, "put_result", put_then_fail)
        with pytest.raises(OSError):
            orchestrator.record(registry, bad)
        assert (len(registry.decisions()), len(registry.runs())) == before
        assert registry.alias("clf", "x86-server").sha256 == run.intakes["candidate"].sha256


def test_device_figures_flow_from_runs_to_the_decision_and_a_ratio_limit(case, tmp_path):
    """The orchestrator carries each run's figures into the decision; a peak-memory ratio limit vs the
    FP32 reference rejects on the native class only (emulated memory is reported, not gated)."""
    backend = FakeBackend(peak_memory_mb={("candidate", X86): 90.0, ("candidate", ARM): 300.0})
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text("[defaults]\nmax_peak_memory_ratio = 1.5\n")
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
    run = gatekit.gate(case["good"], case["reference"], case["data"], resolve([X86, ARM]), load_policy(policy_file),
                        seams=seams, profile=True, early_stop=False)
    decision = run.decision
    assert sorted(backend.profiled) == sorted((r, c) for r in ("candidate", "reference") for c in (X86, ARM))
    assert decision.metrics[X86].device_ratios["peak_memory_ratio"] == pytest.approx(1.8)
    failed = [c for c in decision.checks if not c.passed]
    assert [(c.device_class, c.name) for c in failed] == [(X86, "peak_memory_ratio")]
    assert "max_peak_memory_ratio on tier x86-server" in decision.reasons[0]
    assert decision.metrics[ARM].device["candidate"].emulated
    assert decision.metrics[X86].device["reference"].artifact_bytes == case["reference"].stat().st_size


def test_an_oom_class_is_a_memory_finding_and_the_other_class_is_kept(case):
    run, _, _ = _gate(case, backend=FakeBackend(oom={ARM: 64}))
    decision = run.decision
    oom = [c for c in decision.checks if c.name == "memory_limit"]
    assert {(c.device_class, c.threshold) for c in oom} == {(ARM, 64.0)} and len(oom) == 2
    assert all(c.passed for c in decision.checks if c.device_class == X86)
    assert decision.metrics[X86].device["candidate"].peak_memory_bytes > 0
