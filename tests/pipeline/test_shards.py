"""A tier's samples split over shards (FakeBackend: no Docker): merged in sample order, the decision unchanged,
a failed shard fails that tier only and the finished shards are kept for the re-run."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gatekit
from tiergate import orchestrator, results, state
from tiergate.policy import load_policy
from tiergate.targets import resolve

import modelkit
from fakes import FakeBackend, FakeBuilder

X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"


@pytest.fixture
def case(tmp_path, tiergate_home):
    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(401, 8)).astype(np.float32)      # odd: shards of unequal size
    data = tmp_path / "eval.npz"
    np.savez(data, x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True, output_name="probs"), tmp_path / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + rng.normal(0, 1e-4, w.shape), softmax=True, output_name="probs"),
                          tmp_path / "cand.onnx")
    return {"reference": ref, "candidate": cand, "data": data, "home": tiergate_home}


def _gate(case, shards, backend=None, targets=(X86, ARM)):
    backend = backend or FakeBackend()
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
    # every sample at once (--no-early-stop): these tests are about shards (early looks: test_early_stop.py)
    run = gatekit.gate(case["candidate"], case["reference"], case["data"], resolve(list(targets)), load_policy(None),
                       seams=seams, shards=shards, early_stop=False)
    return run, backend


def _checks(run):
    return [(c.device_class, c.name, c.value, c.passed) for c in run.decision.checks
            if not c.name.startswith(("latency", "noninferior_latency"))]


def test_shard_ranges_cover_every_sample_once():
    for n in (1, 2, 5, 401, 1000):
        for count in (1, 2, 3, 7, 2000):
            spans = orchestrator.shard_ranges(n, count)
            assert spans[0][0] == 0 and spans[-1][1] == n and len(spans) == min(count, n)
            assert all(a < b for a, b in spans) and all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))
            assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1


def test_sharded_outputs_and_decision_equal_the_unsharded(case, tmp_path, monkeypatch):
    whole, _ = _gate(case, shards=1)
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home-sharded"))
    split, backend = _gate(case, shards=3)
    assert {j.samples for j in backend.jobs} == {(0, 134), (134, 267), (267, 401)}
    assert split.decision.verdict == whole.decision.verdict
    assert _checks(split) == _checks(whole)
    for key, folder in whole.run_dirs.items():
        a, b = results.load_outputs(folder), results.load_outputs(split.run_dirs[key])
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        merged = results.load(split.run_dirs[key])
        assert merged.n_samples == 401 and [s["samples"] for s in merged.extra["shards"]] == \
            [[0, 134], [134, 267], [267, 401]]
        assert merged.outputs_sha256 and state.verified(split.run_dirs[key])
        assert not split.run_dirs[key].with_name(split.run_dirs[key].name + results.SHARDS_SUFFIX).exists()


def test_a_failed_shard_fails_its_tier_and_the_rerun_runs_only_that_shard(case):
    backend = FakeBackend(crash_shards={(ARM, 134)})
    run, _ = _gate(case, shards=3, backend=backend)
    failed = [c for c in run.decision.checks if c.device_class == ARM and c.name == "run"]
    assert failed and not failed[0].passed
    assert "shard 2 of 3 (samples 134-267)" in " ".join(run.decision.reasons)
    assert all(c.passed for c in run.decision.checks if c.device_class == X86 and c.name == "run")
    folder = run.run_dirs[("candidate", ARM)]
    kept = folder.with_name(folder.name + results.SHARDS_SUFFIX)
    assert sorted(p.name for p in kept.iterdir()) == ["0-134", "267-401"]
    assert results.load(folder).extra["shards_kept"] == ["0-134", "267-401"]

    again = FakeBackend()
    rerun, _ = _gate(case, shards=3, backend=again)
    assert rerun.decision.verdict != "REJECT", rerun.decision.reasons
    assert sorted((j.role, j.device_class.name, j.samples) for j in again.jobs) == \
        [("candidate", ARM, (134, 267)), ("reference", ARM, (134, 267))]
    whole = results.load_outputs(rerun.run_dirs[("candidate", ARM)])["probs"]
    assert whole.shape[0] == 401 and not kept.exists()


def test_automatic_shards_only_on_emulated_classes(case, monkeypatch):
    monkeypatch.setattr("tiergate.targets.available_cores", lambda: 4)
    run, backend = _gate(case, shards=None)
    by_class = {}
    for job in backend.jobs:
        by_class.setdefault(job.device_class.name, set()).add(job.samples)
    assert by_class[X86] == {None}
    assert by_class[ARM] == {(0, 100), (100, 200), (200, 301), (301, 401)}
    assert json.loads(run.decision.dumps())["verdict"] == run.decision.verdict


class _HookedBackend(FakeBackend):
    """A fake that, like the Docker backend (takes_slot_hooks), makes its 'container' before it takes a run slot
    (Job.on_start) and gives the slot back as its 'harness' ends (Job.on_exited); it records how many were made
    and how many ran at once."""

    takes_slot_hooks = True

    def __init__(self, **kw):
        import threading

        super().__init__(**kw)
        self.guard, self.made, self.running, self.most_made, self.most_running = threading.Lock(), 0, 0, 0, 0
        self.two = threading.Event()      # set once two harnesses run at once: the first waits for it

    def run_many(self, jobs):
        import time

        job = jobs[0]
        with self.guard:
            self.made += 1
            self.most_made = max(self.most_made, self.made)
        try:
            job.on_start()
            with self.guard:
                self.running += 1
                self.most_running = max(self.most_running, self.running)
                if self.running == 2:
                    self.two.set()
            self.two.wait(10)         # two slots: a second harness starts while this one runs, whatever the CPU
            time.sleep(0.05)
            ran = [super(_HookedBackend, self).run(j) for j in jobs]
            with self.guard:
                self.running -= 1
            job.on_exited()
            return ran
        finally:
            with self.guard:
                self.made -= 1


def test_a_backend_with_slot_hooks_runs_at_most_max_parallel_and_makes_at_most_as_many_ahead(case):
    """8 shards on 2 slots: at most 2 harnesses run at once and at most 2 more containers wait made (their files
    copied) for a slot; the decision is the one made without hooks. An emulated tier's latency calls and its
    instruction counting are in its first shard only; the others make the cold first call alone."""
    backend = _HookedBackend()
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
    run = gatekit.gate(case["candidate"], case["reference"], case["data"], resolve([ARM]), load_policy(None),
                       seams=seams, shards=8, early_stop=False, max_parallel=2)
    assert backend.most_running == 2 and backend.most_made <= 4
    plain, _ = _gate(case, 8, targets=(ARM,))
    assert _checks(run) == _checks(plain)
    first = min(j.samples for j in backend.jobs)
    for job in backend.jobs:
        assert (job.latency_calls > 0, job.count) == ((True, True) if job.samples == first else (False, False))
