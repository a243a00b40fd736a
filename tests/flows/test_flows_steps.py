"""The orchestrator's Steps seam as Prefect tasks, with the fake builder and backend: the flow path runs the
very same sequence as the CLI (same decision, same caches), each step a task run; conclude() publishes."""

from __future__ import annotations

import numpy as np
import pytest

import modelkit
import gatekit
from tiergate import orchestrator
from tiergate.policy import load_policy
from tiergate.targets import resolve

X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"


@pytest.fixture
def case(tmp_path, tiergate_home, monkeypatch):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")   # a busy 2-core machine
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    write = lambda name, weights: modelkit.write(modelkit.linear(weights, softmax=True), tmp_path / name)  # noqa: E731
    return write("cand.onnx", w + 1e-4), write("ref.onnx", w), tmp_path / "eval.npz", tmp_path


@pytest.mark.prefect
@pytest.mark.slow
def test_prefect_steps_run_the_same_gate_as_threads(case):
    from fakes import FakeBackend, FakeBuilder
    from prefect import flow

    from tiergate.orchestration.gating import PrefectSteps, conclude

    cand, ref, data, tmp = case
    dcs, policy = resolve([X86, ARM]), load_policy(None)
    backend = FakeBackend(crash={("candidate", ARM)})

    @flow(name="steps-under-test")
    def gate_flow():
        seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend, steps=PrefectSteps())
        run = gatekit.gate(cand, ref, data, dcs, policy, seams=seams, early_stop=False)     # every sample: the
        # steps are under test here, not the early decision an emulated tier takes by default
        done = conclude(run, report_dir=tmp / "reports", label="steps test")
        return run, done

    run, done = gate_flow()
    assert sorted(backend.runs) == sorted((r, c) for r in ("candidate", "reference") for c in (X86, ARM))
    assert run.decision.verdict == done.verdict == "REJECT" and not done.decision_cached
    assert [(c.device_class, c.name) for c in run.decision.checks if not c.passed] == [(ARM, "run")]
    assert (tmp / "reports" / "gate-decision.json").read_text().strip() == run.decision.dumps()

    again = gatekit.gate(cand, ref, data, dcs, policy,       # the CLI's thread steps: same caches, same decision
                          seams=orchestrator.Seams(builder=FakeBuilder(), backend_for=FakeBackend()), early_stop=False)
    assert again.cache_hits == 3 and again.containers_started == 1       # only the crashed run is run again
    assert again.decision.verdict == "PROMOTE" and not again.decision_cached   # new evidence, new decision


def test_pool_builder_defers_pooled_classes_to_their_worker():
    from fakes import FakeBuilder

    from tiergate.orchestration.remote import PoolBackend, PoolBuilder

    inner = FakeBuilder()
    builder = PoolBuilder(inner, {ARM: "arm-boards"})
    intake = type("I", (), {"sha256": "ab" * 32, "artifact": type("A", (), {"path": "m.onnx"})()})()
    pooled = builder.build(resolve([ARM])[0], intake)
    assert pooled.image_id == "work-pool:arm-boards" and inner.calls == []
    assert builder.describe(resolve([ARM])[0], intake, pooled) is None
    local = builder.build(resolve([X86])[0], intake)
    assert local.image_id.startswith("sha256:fake-") and inner.calls == [(X86, "ab" * 32)]
    assert PoolBackend("arm-boards", None).caches_locally is False


def test_a_pool_shares_an_emulated_tier_among_its_workers_online(monkeypatch):
    """One share of the samples per worker of the pool online (issue 46), at least the class's shard_samples a
    share; --shards (or the class's shards) says otherwise; no worker known yet: one share."""
    from tiergate.orchestration import remote

    backend = remote.PoolBackend("arm-boards", None)
    monkeypatch.setattr(remote, "_workers_online", lambda pool: 3)
    assert backend.share_count(400, None, 64) == 3 and backend.share_count(100, None, 64) == 1
    assert backend.share_count(400, 2, 64) == 2
    monkeypatch.setattr(remote, "_workers_online", lambda pool: 0)
    assert backend.share_count(400, None, 64) == 1
    assert backend.takes_samples and not backend.takes_slots
