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
    monkeypatch.setattr("tiergate.targets.host.available_cores", lambda: 4)
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
    copied) for a slot; the decision is the one made without hooks. An emulated tier's latency calls are in its
    first shard only; the others make the cold first call alone. Nothing asks for instructions: none is counted."""
    backend = _HookedBackend()
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
    run = gatekit.gate(case["candidate"], case["reference"], case["data"], resolve([ARM]), load_policy(None),
                       seams=seams, shards=8, early_stop=False, max_parallel=2)
    assert backend.most_running == 2 and backend.most_made <= 4
    plain, _ = _gate(case, 8, targets=(ARM,))
    assert _checks(run) == _checks(plain)
    first = min(j.samples for j in backend.jobs)
    for job in backend.jobs:
        assert (job.latency_calls > 0, job.count) == ((True, False) if job.samples == first else (False, False))


@pytest.mark.parametrize("asks", ["nothing", "policy", "profile"])
def test_instructions_are_counted_in_the_first_shard_only_where_asked_for(case, tmp_path, asks):
    """The counting QEMU runs where a policy judges instructions (max_instructions_*) or --profile asks for the
    run's figures (issue 46): a counted run is another run (its key names the counter), so a gate that asks
    nothing shares no run with one that does."""
    policy = load_policy(None)
    if asks == "policy":
        (tmp_path / "p.toml").write_text("[override.cortex-a]\nmax_instructions_ratio = 2.0\n")
        policy = load_policy(tmp_path / "p.toml")
    backend = FakeBackend()
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
    gatekit.gate(case["candidate"], case["reference"], case["data"], resolve([ARM, X86]), policy, seams=seams,
                 shards=2, early_stop=False, profile=asks == "profile")
    first = {dc: min(j.samples for j in backend.jobs if j.device_class.name == dc) for dc in (ARM, X86)}
    counted = {(j.device_class.name, j.samples == first[j.device_class.name]) for j in backend.jobs if j.count}
    assert counted == (set() if asks == "nothing" else {(ARM, True)} | ({(X86, True)} if asks == "profile" else set()))


def test_a_tier_spreads_its_batched_calls_over_one_container_only_where_they_can_run_at_once(monkeypatch):
    """spread_workers: an emulated onnxruntime class on a backend that spreads calls gets the cores' workers in one
    container; a fixed batch dimension, another runtime, a shard count asked for, batching off or a backend that
    cannot grant slots keeps the shards."""
    import dataclasses
    from types import SimpleNamespace

    from tiergate.artifact.model import TensorSpec
    from tiergate.orchestrator.spans import spread_workers

    monkeypatch.setattr("tiergate.targets.host.available_cores", lambda: 4)
    (arm,), (x86,), (lite,) = resolve([ARM]), resolve([X86]), resolve(["arm64-cpu-tflite"])
    data = SimpleNamespace(n_samples=300, info={"x": None}, axis=lambda name: 0)
    spreads, plain = SimpleNamespace(spreads_calls=True), SimpleNamespace()

    def specs(*shapes):
        return [SimpleNamespace(intake=SimpleNamespace(artifact=SimpleNamespace(
            inputs=[TensorSpec("x", shape, "float32")]))) for shape in shapes]
    assert spread_workers(arm, specs(("N", 8), (None, 8)), data, spreads) == 4
    assert spread_workers(arm, specs(("N", 8), (1, 8)), data, spreads) == 1          # one artifact's batch is fixed
    assert spread_workers(arm, specs(("N", 8)), data, plain) == 1
    assert spread_workers(arm, specs(("N", 8)), data, spreads, requested_shards=2) == 1
    assert spread_workers(lite, specs(("N", 8)), data, spreads) == 1                 # LiteRT's interpreter: one call
    assert spread_workers(x86, specs(("N", 8)), data, spreads) == 1                  # native: batching off
    two = dataclasses.replace(arm, evaluation=dataclasses.replace(arm.evaluation, workers=2))
    assert spread_workers(two, specs(("N", 8)), data, spreads) == 2
    one = dataclasses.replace(arm, evaluation=dataclasses.replace(arm.evaluation, workers=1))
    assert spread_workers(one, specs(("N", 8)), data, spreads) == 1
    one_sample = SimpleNamespace(n_samples=1, info={"x": None}, axis=lambda name: 0)
    assert spread_workers(arm, specs(("N", 8)), one_sample, spreads) == 1


def test_the_host_and_the_harness_share_one_list_of_the_runtimes_whose_calls_run_at_once(tmp_path, monkeypatch):
    """CALLS_AT_ONCE (containers/harness/harness_batched.py) is the one definition: the host reads it from the
    harness's source (harness_source.calls_at_once), spread_workers spreads a tier's calls for exactly those
    runtimes, the harness's runners are concurrent exactly where their runtime is in it, and neither side spells a
    runtime of its own."""
    import dataclasses
    import inspect
    from types import SimpleNamespace

    from tiergate import harness_source
    from tiergate.artifact.model import TensorSpec
    from tiergate.orchestrator.spans import spread_workers
    from tiergate.paths import containers_dir
    from tiergate.targets import RUNTIMES

    from fakes import harness

    h = harness()
    batched = h._plugin("harness_batched")
    assert batched.CALLS_AT_ONCE and set(batched.CALLS_AT_ONCE) <= set(RUNTIMES)
    assert harness_source.calls_at_once() == frozenset(batched.CALLS_AT_ONCE)        # the host reads the harness's

    monkeypatch.setattr("tiergate.targets.available_cores", lambda: 4)
    (arm,) = resolve([ARM])
    data = SimpleNamespace(n_samples=300, info={"x": None}, axis=lambda name: 0)
    specs = [SimpleNamespace(intake=SimpleNamespace(artifact=SimpleNamespace(inputs=[TensorSpec("x", ("N", 8),
                                                                                                  "float32")])))]
    for runtime in RUNTIMES:
        spread = spread_workers(dataclasses.replace(arm, runtime=runtime), specs, data,
                                SimpleNamespace(spreads_calls=True))
        assert (spread > 1) == (runtime in batched.CALLS_AT_ONCE), runtime

    model = modelkit.write(modelkit.linear(np.ones((8, 4))), tmp_path / "m.onnx")
    args = h.parse_args(["--runtime", "onnxruntime", "--model", str(model), "--data", "d.npz", "--out", "o"])
    assert h.make_runner(args).concurrent is ("onnxruntime" in batched.CALLS_AT_ONCE)
    monkeypatch.setattr(batched, "CALLS_AT_ONCE", ())                   # the harness follows its one list
    assert h.make_runner(args).concurrent is False

    # nowhere else: no runner says it of itself, and the host's spreading names no runtime
    for path in (containers_dir() / "harness").glob("*.py"):
        assert ".concurrent = True" not in path.read_text() and \
            (path.name == "harness_batched.py" or "CALLS_AT_ONCE = " not in path.read_text()), path.name
    assert not any(f'"{runtime}"' in inspect.getsource(spread_workers) for runtime in RUNTIMES)


def test_more_slots_are_taken_as_they_come_free_and_all_given_back_with_the_first():
    """_Slot.more: a harness that spreads its calls holds one run slot at its start and gets each further one
    when another run gives it back (grant per slot); its end gives back every slot it held, and a grant still
    waiting then never comes."""
    import time

    from tiergate.orchestrator.spans import RunSlots, _Slot

    slots = RunSlots(2)
    other = _Slot(slots)
    other.take()                                      # another tier's run holds the second slot
    mine, granted = _Slot(slots), []
    mine.take()
    mine.more(2, lambda: granted.append(time.monotonic()))
    time.sleep(0.3)
    assert granted == []                              # no slot free yet
    other.give()
    deadline = time.monotonic() + 5
    while not granted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(granted) == 1                          # the one that came free; the pool has no third
    mine.give()
    mine.extra_thread.join(timeout=5)
    assert not mine.extra_thread.is_alive() and len(granted) == 1
    assert slots.running.acquire(blocking=False) and slots.running.acquire(blocking=False)   # both back


def test_a_start_waiting_for_its_first_slot_goes_before_a_running_harness_s_further_slots():
    """A native tier's harness start made ahead (its container filled) takes the free slot before an emulated
    tier's running harness takes it for one more call at once: the native tier is never queued behind the
    emulated one's spread calls (its REJECT, final, then stops the emulated tier early)."""
    import time

    from tiergate.orchestrator.spans import RunSlots, _Slot

    slots = RunSlots(2)
    emulated, granted = _Slot(slots), []
    emulated.take()
    native = _Slot(slots)
    native.ahead()                                    # made and filled ahead: waiting for its first slot
    emulated.more(1, lambda: granted.append(time.monotonic()))
    time.sleep(0.4)
    assert granted == [] and slots.queued == 1        # the free slot is kept for the waiting start
    native.take()
    assert slots.queued == 0 and native.held
    native.give()                                     # the native run ends: the emulated harness gets its slot
    deadline = time.monotonic() + 5
    while not granted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(granted) == 1
    emulated.give()
    emulated.extra_thread.join(timeout=5)
    assert slots.running.acquire(blocking=False) and slots.running.acquire(blocking=False)   # both back
