"""Early decision (sequential looks at growing sample prefixes; FakeBackend: no Docker): off by default and
then nothing changes; a clearly bad candidate is rejected at the first look, a near-identical one promoted before
the last, a borderline one runs every look; every chunk runs once, and a re-run is a cache hit."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

import gatekit
from tiergate import evaldata
from tiergate import orchestrator, results, state
from tiergate.gate import INCONCLUSIVE, PROMOTE, REJECT, Decision
from tiergate.policy import load_policy
from tiergate.targets import resolve

import modelkit
from fakes import FakeBackend, FakeBuilder, HeldBackend

X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"
FOUR = "[defaults]\nearly_looks = 4\n"          # the tests of a plan with a look it does not take


def _case(tmp_path, n: int, candidate: str):
    rng = np.random.default_rng(5)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(n, 8)).astype(np.float32)
    data = tmp_path / f"eval-{n}.npz"
    np.savez(data, x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True, output_name="probs"), tmp_path / "ref.onnx")
    weights = {"near": w + rng.normal(0, 1e-5, w.shape), "random": rng.normal(size=w.shape)}[candidate]
    cand = modelkit.write(modelkit.linear(weights, softmax=True, output_name="probs"), tmp_path / f"{candidate}.onnx")
    return cand, ref, data


def _policy(tmp_path, text: str = ""):
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return load_policy(path)


def _gate(case, policy, *, targets=(X86,), backend=None, **kw):
    backend = backend or FakeBackend()
    seams = orchestrator.Seams(builder=FakeBuilder(), backend_for=backend)
    cand, ref, data = case
    return gatekit.gate(cand, ref, data, resolve(list(targets)), policy, seams=seams, **kw), backend


def _chunks_run(backend):
    return collections.Counter((j.role, j.device_class.name, j.data_sha256) for j in backend.jobs)


def test_on_by_default_for_emulated_classes_only_and_off_changes_nothing(tmp_path, tiergate_home, monkeypatch):
    case = _case(tmp_path, 400, "near")
    whole = evaldata.load_eval_data(case[2]).sha256
    default, backend = _gate(case, load_policy(None), targets=(X86, ARM))
    assert default.decision.early_stop[X86].looks == 1                  # native: off (one look, every sample);
    assert default.decision.early_stop[ARM].looks == 2                  # emulated: on
    assert [look.taken for look in default.decision.early_stop[ARM].plan] == [True, True]   # 2 looks by default
    assert {j.data_sha256 for j in backend.jobs if j.device_class.name == X86} == {whole}
    arm_runs = _chunks_run(backend)
    arm_data = [d for (_, name, d) in arm_runs if name == ARM]
    assert whole not in arm_data and len(set(arm_data)) == 2            # half the samples, then the other half
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home-off"))
    off, off_backend = _gate(case, _policy(tmp_path, "[defaults]\nearly_stop = false\nearly_looks = 3\n"),
                             targets=(X86, ARM), early_stop=None)
    assert {j.data_sha256 for j in off_backend.jobs} == {whole}         # every sample, in file order, one start
    assert "early_stop" not in off.decision.to_json()
    assert not any("early stop" in note for note in off.decision.notes)
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home-flag-off"))
    flag_off, _ = _gate(case, load_policy(None), targets=(X86, ARM), early_stop=False)
    flag_off.decision.policy_sources = off.decision.policy_sources      # the same but for the file it came from
    assert flag_off.decision.dumps() == off.decision.dumps()


def test_too_few_samples_for_any_early_look_is_the_plain_gate(tmp_path, tiergate_home, monkeypatch):
    case = _case(tmp_path, 32, "near")            # no look before the last can resolve its share: nothing to stop on
    on, backend = _gate(case, load_policy(None), targets=(X86, ARM), early_stop=True)
    assert "early_stop" not in on.decision.to_json()
    assert {j.data_sha256 for j in backend.jobs} == {evaldata.load_eval_data(case[2]).sha256}
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home-off"))
    off, _ = _gate(case, load_policy(None), targets=(X86, ARM), early_stop=False)
    assert on.decision.dumps() == off.decision.dumps()


def test_the_default_spending_is_o_brien_fleming_else_kim_demets_and_pocock_by_name(tmp_path, tiergate_home,
                                                                                    monkeypatch):
    """early_spending = "auto" (the default) is O'Brien-Fleming where it looks early: 400 samples look at 200
    (99.44 %); below that Kim-DeMets' alpha t^2 where it does: 160 samples look at 80 (98.75 %) and end at 96.25 %
    (nearer the plain gate's 95 % than Pocock's 98.10 %); 96 run as one look another class's REJECT may stop.
    A clear verdict on 160 samples of an emulated tier alone is decided on the first 80; "pocock" by name too."""
    from tiergate.orchestrator import early_settings

    policy, dcs = load_policy(None), resolve([X86, ARM])
    at = {n: early_settings(policy, dcs, None, n)[ARM] for n in (400, 160, 96, 32)}
    assert (at[400].spending, at[400].looks) == ("obrien-fleming", 2)
    assert (at[160].spending, at[160].looks) == ("kim-demets", 2)
    assert (at[96].spending, at[96].looks) == ("obrien-fleming", 1)    # no plan looks early: stoppable only
    assert at[32].looks == 1
    assert early_settings(policy, resolve([ARM]), None, 96) == {}      # alone, nothing to stop it: the plain gate
    run, backend = _gate(_case(tmp_path, 160, "random"), policy, targets=(ARM,))
    tier = run.decision.early_stop[ARM]
    assert run.decision.verdict == REJECT
    assert (tier.look, tier.looks, tier.samples_used, tier.spending) == (1, 2, 80, "kim-demets")
    assert tier.confidence == pytest.approx(1 - 0.05 * 0.5 ** 2)
    assert [look.confidence for look in tier.plan] == pytest.approx([0.9875, 0.9625])
    assert len({j.data_sha256 for j in backend.jobs}) == 1             # only the first chunk ran
    policy = _policy(tmp_path, '[defaults]\nearly_spending = "pocock"\n')
    assert (early_settings(policy, dcs, None, 160)[ARM].looks, early_settings(policy, dcs, None, 160)[ARM].spending) \
        == (2, "pocock")
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home-pocock"))
    run, backend = _gate(_case(tmp_path, 160, "random"), policy, targets=(ARM,))
    tier = run.decision.early_stop[ARM]
    assert run.decision.verdict == REJECT
    assert (tier.look, tier.looks, tier.samples_used, tier.spending) == (1, 2, 80, "pocock")
    assert tier.confidence == pytest.approx(1 - 0.05 * np.log(1 + (np.e - 1) * 0.5))
    assert len({j.data_sha256 for j in backend.jobs}) == 1             # only the first chunk ran


def test_a_bad_candidate_is_rejected_at_the_first_look(tmp_path, tiergate_home):
    case = _case(tmp_path, 400, "random")
    run, backend = _gate(case, _policy(tmp_path, "[defaults]\nearly_looks = 2\n"), targets=(X86, ARM),
                         early_stop=True)
    d = run.decision
    assert d.verdict == REJECT
    for name in (X86, ARM):
        tier = d.early_stop[name]
        if tier.stopped_by:         # the other tier's REJECT came first and stopped it before its run started
            assert tier.stopped_by == ({X86, ARM} - {name}).pop() and tier.look == 0
            assert not d.early_stop[tier.stopped_by].stopped_by
            continue
        assert (tier.look, tier.looks, tier.samples_used, tier.samples_total) == (1, 2, 200, 400)
        assert tier.stopped_early and tier.verdict == REJECT and tier.confidence == tier.plan[0].confidence
        assert d.metrics[name].task["top1_accuracy"].n == 200
        assert any(n.startswith(f"{name}: early stop: REJECT settled at look 1 of 2, on 200 of 400") for n in d.notes)
    failed = [c for c in d.checks if c.name == "accuracy_ratio"]
    assert failed and all(not c.passed and not c.inconclusive for c in failed)
    assert {c.device_class for c in failed} | {n for n, t in d.early_stop.items() if t.stopped_by} == {X86, ARM}
    assert all(results.load(f).n_samples == 200 for f in run.run_dirs.values())
    assert len({j.data_sha256 for j in backend.jobs}) == 1          # only the first chunk ran
    assert Decision.from_json(json.loads(d.dumps())) == d


def test_a_near_identical_candidate_is_promoted_before_the_last_look(tmp_path, tiergate_home):
    case = _case(tmp_path, 2400, "near")
    run, backend = _gate(case, _policy(tmp_path, FOUR), early_stop=True)      # 4 looks, O'Brien-Fleming spending
    d = run.decision
    tier = d.early_stop[X86]
    assert d.verdict == PROMOTE, d.reasons
    assert [look.taken for look in tier.plan] == [False, True, True, True]     # 600 samples cannot resolve 9e-5
    assert (tier.look, tier.samples_used, tier.stopped_early) == (2, 1200, True)
    assert abs(sum(1 - look.confidence for look in tier.plan if look.taken) - 0.05) < 1e-12
    interval = next(c.interval for c in d.checks if c.name == "accuracy_ratio")
    assert interval.method == "score-ratio-paired" and interval.confidence == tier.plan[1].confidence
    assert len({j.data_sha256 for j in backend.jobs}) == 1          # chunks 1 and 2 in one start, never 3 and 4
    merged = results.load(run.run_dirs[("candidate", X86)])
    assert merged.n_samples == 1200 and merged.extra.get("shards") is None   # one run: nothing merged
    assert state.verified(run.run_dirs[("candidate", X86)])


def test_a_borderline_candidate_runs_every_look_and_each_chunk_once(tmp_path, tiergate_home):
    case = _case(tmp_path, 400, "near")
    policy = _policy(tmp_path, FOUR + "early_stop = true\nmin_accuracy_ratio = 0.999\n")
    run, backend = _gate(case, policy, targets=(X86, ARM))
    d = run.decision
    assert d.verdict == INCONCLUSIVE
    for name in (X86, ARM):
        tier = d.early_stop[name]
        assert (tier.look, tier.looks, tier.samples_used, tier.stopped_early) == (4, 4, 400, False)
        assert tier.confidence == tier.plan[-1].confidence > 0.95      # the last look spends only what is left
    counts = _chunks_run(backend)
    # roles x classes x runs, once each: look 1 is not taken, so its chunk runs with look 2's
    assert len(counts) == 2 * 2 * 3                                    # (an emulated class shards a run: once
    shards = collections.Counter((j.role, j.device_class.name, j.data_sha256, j.samples) for j in backend.jobs)
    assert set(shards.values()) == {1}                                 # per shard of its samples)
    assert run.containers_started == 12

    again, rerun_backend = _gate(case, policy, targets=(X86, ARM))
    assert not rerun_backend.jobs and again.containers_started == 0 and again.cache_hits == 12
    assert again.decision_cached and again.decision.dumps() == d.dumps()


def test_early_stop_per_class_from_the_policy(tmp_path, tiergate_home):
    case = _case(tmp_path, 2400, "near")
    policy = _policy(tmp_path, "[defaults]\nearly_stop = true\n[override.cortex-a]\nearly_stop = false\n")
    run, backend = _gate(case, policy, targets=(X86, ARM))
    d = run.decision
    assert d.verdict == PROMOTE, d.reasons
    assert (d.early_stop[X86].samples_used, d.early_stop[X86].stopped_early) == (1200, True)
    assert (d.early_stop[ARM].samples_used, d.early_stop[ARM].looks, d.early_stop[ARM].confidence) == (2400, 1, 0.95)
    whole = evaldata.load_eval_data(case[2]).sha256
    assert {j.data_sha256 for j in backend.jobs if j.device_class.name == ARM} == {whole}
    assert any("cross-tier drift compared on the 1200 samples every device class used" in n for n in d.notes)
    pairs = d.drift["candidate"].pairs                  # compared on the common samples, row for row
    assert pairs and all(drift["probs"].max_abs_error < 1e-6 for drift in pairs.values())


def test_the_decision_cache_names_the_early_stop_settings(tmp_path, tiergate_home):
    case = _case(tmp_path, 400, "near")
    policy = _policy(tmp_path, FOUR + "min_accuracy_ratio = 0.999\n")
    four, _ = _gate(case, policy, early_stop=True)
    three, _ = _gate(case, _policy(tmp_path, "[defaults]\nmin_accuracy_ratio = 0.999\nearly_looks = 3\n"),
                     early_stop=True)
    assert four.decision_key != three.decision_key and not three.decision_cached
    saved = json.loads(state.decision_path(four.decision_key).read_text())
    assert saved["inputs"]["early_stop"][X86]["looks"] == 4


def _sorted_case(tmp_path, n: int = 2000, order: str = "sorted", candidate: str = "blind"):
    """The issue's case: ten classes, the file sorted by label (or shuffled); the "blind" candidate never predicts
    classes 8 and 9 (about a fifth of the samples, all at the end of the sorted file) and is right on every other
    one; the "near" one is the reference but for noise in the weights."""
    rng = np.random.default_rng(25)
    w = rng.normal(size=(8, 10))
    noise = rng.normal(0, 1e-5, w.shape)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    labels = (x @ w).argmax(1).astype(np.int64)
    rows = np.argsort(labels, kind="stable") if order == "sorted" else rng.permutation(n)
    data = tmp_path / f"eval-{order}.npz"
    np.savez(data, x=x[rows], labels=labels[rows])
    ref = modelkit.write(modelkit.linear(w, softmax=True, output_name="probs"), tmp_path / "ref.onnx")
    weights, bias = w + noise, np.zeros(10, dtype=np.float32)
    if candidate == "blind":
        weights[:, 8:], bias[8:] = 0.0, -1e4            # never class 8 or 9
    cand = modelkit.write(modelkit.linear(weights, bias, softmax=True, output_name="probs"),
                          tmp_path / f"{candidate}.onnx")
    return cand, ref, data


def test_early_stop_never_promotes_a_candidate_wrong_on_the_last_classes_of_a_sorted_file(tmp_path, tiergate_home):
    """Issue 25 (2): looks used to be file-order prefixes, so on a file sorted by label the first half held no 8
    or 9 and the candidate was promoted at look 2; the full gate rejects it. The looks are a stratified random
    partition now: every look holds each class in its share."""
    case = _sorted_case(tmp_path)
    labels = np.load(case[2])["labels"]
    wrong = np.isin(labels, (8, 9)).mean()
    assert 0.15 < wrong < 0.25 and (np.diff(labels) >= 0).all()
    full, _ = _gate(case, load_policy(None))
    assert full.decision.verdict == REJECT
    run, _ = _gate(case, load_policy(None), early_stop=True)
    d, tier = run.decision, run.decision.early_stop[X86]
    assert d.verdict == REJECT and tier.verdict == REJECT, d.reasons
    accuracy = d.metrics[X86].task["top1_accuracy"]     # the candidate's, on the look's samples: the whole set's
    assert accuracy.n == tier.samples_used and abs(accuracy.candidate - (1 - wrong)) < 0.02


def test_the_file_order_of_the_samples_decides_nothing(tmp_path, tiergate_home):
    """The same samples sorted by label and shuffled: the same looks, the same decision (the chunks are the same
    samples, so the second file's chunk runs are the first's, from the run cache)."""
    for candidate, verdict in (("blind", REJECT), ("near", PROMOTE)):
        runs = {order: _gate(_sorted_case(tmp_path, 1200, order, candidate), load_policy(None), early_stop=True)
                for order in ("sorted", "shuffled")}
        (a, _), (b, backend) = runs["sorted"], runs["shuffled"]
        assert a.decision.verdict == b.decision.verdict == verdict, a.decision.reasons
        assert a.decision.early_stop == b.decision.early_stop
        assert [c.to_json() for c in a.decision.checks] == [c.to_json() for c in b.decision.checks]
        assert not backend.jobs and b.containers_started == 0       # every chunk run reused: the same samples


def test_the_seed_is_in_the_decision_and_its_cache_key(tmp_path, tiergate_home, capsys):
    case = _case(tmp_path, 400, "near")
    policy = "[defaults]\nmin_accuracy_ratio = 0.999\nearly_looks = 2\n"
    default, first = _gate(case, _policy(tmp_path, policy), early_stop=True, progress=print)
    assert default.decision.early_stop[X86].seed == 0
    assert "seed 0" in capsys.readouterr().out
    saved = json.loads(state.decision_path(default.decision_key).read_text())
    assert saved["inputs"]["early_stop"][X86]["seed"] == 0 and saved["decision"]["early_stop"][X86]["seed"] == 0
    assert any("seed 0" in note for note in default.decision.notes)
    other, second = _gate(case, _policy(tmp_path, policy + "early_seed = 7\n"), early_stop=True)
    assert other.decision.early_stop[X86].seed == 7 and other.decision_key != default.decision_key
    chunks = {j.data_sha256 for j in first.jobs}
    assert chunks and chunks.isdisjoint(j.data_sha256 for j in second.jobs)     # another partition, other runs


@pytest.mark.parametrize("text, problem", [
    ("early_seed = -1", "from 0 to"),
    ("early_seed = 1.5", "from 0 to"),
    ("early_seed = true", "from 0 to"),
    ("early_stop = 1", "must be true or false"),
    ("early_looks = 1", "from 2 to 20"),
    ("early_looks = 2.5", "from 2 to 20"),
    ("early_spending = 'haybittle'", "must be one of"),
])
def test_early_stop_keys_are_validated(tmp_path, text, problem):
    from tiergate.errors import InputError

    with pytest.raises(InputError, match=problem):
        _policy(tmp_path, f"[defaults]\n{text}\n")


def test_a_crashing_candidate_is_rejected_at_the_first_chunk(tmp_path, tiergate_home):
    case = _case(tmp_path, 2400, "near")
    backend = FakeBackend(crash={("candidate", X86)})
    run, _ = _gate(case, _policy(tmp_path, FOUR), targets=(X86, ARM), backend=backend, early_stop=True)
    d = run.decision
    assert d.verdict == REJECT
    # a crash needs no statistics: settled by the first run (chunks 1 and 2: look 1 is not taken)
    assert (d.early_stop[X86].look, d.early_stop[X86].samples_used) == (2, 1200)
    assert d.early_stop[ARM].verdict == PROMOTE and d.early_stop[ARM].look == 2
    shas = {name: [j.data_sha256 for j in backend.jobs if j.device_class.name == name] for name in (X86, ARM)}
    assert len(set(shas[X86])) == 1 and set(shas[X86]) == set(shas[ARM])
    assert len(_chunks_run(backend)) == 2 + 2          # one run of both roles on each class


def test_the_cli_says_how_many_samples_each_tier_used(tmp_path, tiergate_home, monkeypatch, capsys):
    from tiergate.cli.main import main

    cand, ref, data = _case(tmp_path, 2400, "near")
    gatekit.fake_cli_seams(monkeypatch, FakeBuilder(), FakeBackend())
    (tmp_path / "four.toml").write_text(FOUR)
    base = ["gate", "--candidate", str(cand), "--reference", str(ref), "--data", str(data), "--targets", X86,
            "--policy", str(tmp_path / "four.toml")]
    assert main(base + ["--early-stop"]) == 0
    out = capsys.readouterr().out
    assert f"early stop: {X86}: settled PROMOTE at look 2 of 4, 1200 of 2400 samples used" in out
    assert main(base + ["--early-stop", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["early_stop"][X86]["samples_used"] == 1200
    assert main(base) == 0
    assert "early stop" not in capsys.readouterr().out


def test_gc_keeps_the_chunk_runs_a_kept_decision_names(tmp_path, tiergate_home):
    from datetime import datetime, timedelta, timezone

    from tiergate import gc

    case = _case(tmp_path, 400, "near")
    policy = _policy(tmp_path, FOUR + "early_stop = true\nmin_accuracy_ratio = 0.999\n")
    run, _ = _gate(case, policy)
    plan = gc.plan(tiergate_home, gc.Needs(), None, now=datetime.now(timezone.utc) + timedelta(days=30),
                   pid_alive=lambda pid: False, keep_last=20)     # every decision of the gate kept
    runs = {item.name: item for item in plan.items if item.kind == "run"}
    assert len(runs) == 2 * 3 + 2 * 2            # runs (looks 1+2, 3, 4), and prefixes of 2 and 3 runs, per role
    named = json.loads(state.decision_path(run.decision_key).read_text())["inputs"]["runs"]
    chunks = {v.split(":")[0] for k, v in named.items() if "/chunk-" in k}
    assert len(chunks) == 6 and all(not runs[c].remove for c in chunks)
    assert all(not runs[v.split(":")[0]].remove for v in named.values())
    again, backend = _gate(case, policy)
    assert not backend.jobs and again.decision_cached


@pytest.mark.docker
def test_early_stop_on_the_real_engine_x86(tmp_path, tiergate_home):
    """Chunks as ordinary container runs: a near-identical candidate is promoted at look 1 of 2 (the default
    plan) on 1,200 of 2,400 samples, one run per role started; the re-run starts nothing."""
    cand, ref, data = _case(tmp_path, 2400, "near")
    classes = resolve([X86])
    run = gatekit.gate(cand, ref, data, classes, load_policy(None), early_stop=True)
    tier = run.decision.early_stop[X86]
    assert run.decision.verdict == PROMOTE, run.decision.reasons
    assert (tier.look, tier.looks, tier.samples_used, run.containers_started) == (1, 2, 1200, 2)
    again = gatekit.gate(cand, ref, data, classes, load_policy(None), early_stop=True)
    assert again.containers_started == 0 and again.decision_cached and again.decision.dumps() == run.decision.dumps()


def test_copies_of_one_sample_scatter_over_the_chunks(tmp_path, tiergate_home):
    """A set with many copies of one sample (blank frames: the same bytes, the same label) splits them over the
    chunks like any samples, not all into one; another file order gives the same partition of the samples."""
    from tiergate.orchestrator.spans import partition, sample_order

    rng = np.random.default_rng(5)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    labels = np.arange(400) % 2
    blank = np.flatnonzero(labels == 0)[:60]
    x[blank] = 1.0

    def halves(rows):
        path = tmp_path / f"copies-{rows[0]}.npz"
        np.savez(path, x=x[rows], labels=labels[rows])
        data = evaldata.load_eval_data(path)
        first, second = partition(sample_order(evaldata.sample_keys(data, 0), data.labels, 0), 2)[1]
        return rows[first], rows[second]

    first, second = halves(np.arange(400))
    assert 20 <= np.isin(first, blank).sum() <= 40 and np.isin(first, blank).sum() + np.isin(second, blank).sum() == 60
    shuffle = rng.permutation(400)
    again, _ = halves(shuffle)
    key = lambda rows: sorted(map(bytes, (x[r].tobytes() + bytes([labels[r]]) for r in rows)))   # noqa: E731
    assert key(again) == key(first)             # the same samples (copies are interchangeable)


def test_the_looks_are_a_stratified_seeded_partition_made_from_the_samples(tmp_path, tiergate_home):
    """Every prefix of the order holds each class within two samples of its share; without labels (or with labels
    that are no class index) a plain seeded permutation; the same samples in another file order give the same
    samples in the same order; another seed another order."""
    from tiergate.orchestrator.spans import partition, sample_order

    rng = np.random.default_rng(3)
    labels = np.sort(rng.choice(5, size=997, p=[0.5, 0.2, 0.15, 0.1, 0.05]))
    x = rng.normal(size=(997, 3)).astype(np.float32)

    def order_of(rows, seed=0, with_labels=True):
        path = tmp_path / f"d-{seed}-{with_labels}-{rows[0]}-{rows[1]}.npz"
        np.savez(path, x=x[rows], **({"labels": labels[rows]} if with_labels else {}))
        data = evaldata.load_eval_data(path)
        return data, sample_order(evaldata.sample_keys(data, seed), data.labels, seed)

    data, order = order_of(np.arange(997))
    assert sorted(order.tolist()) == list(range(997))
    shares = np.bincount(labels) / len(labels)
    for m in range(1, 998):
        assert np.all(np.abs(np.bincount(labels[order[:m]], minlength=5) - m * shares) < 2), m
    shuffle = rng.permutation(997)
    _, reordered = order_of(shuffle)
    assert np.array_equal(shuffle[reordered], order)            # the same samples, in the same order
    _, other = order_of(np.arange(997), seed=1)
    assert not np.array_equal(other, order)
    _, plain = order_of(np.arange(997), with_labels=False)
    assert sorted(plain.tolist()) == list(range(997)) and not np.array_equal(plain, np.arange(997))
    spans, rows = partition(order, 4)
    assert [len(r) for r in rows] == [b - a for a, b in spans] and np.array_equal(np.concatenate(rows), order)
    assert np.array_equal(partition(order, 1)[1][0], np.arange(997))   # one look: the file as it is
    chunk = evaldata.select(data, rows[1])
    assert np.array_equal(np.load(chunk.path)["x"], x[rows[1]]) and np.array_equal(chunk.labels, labels[rows[1]])


def test_a_final_reject_stops_the_other_tiers_runs(tmp_path, tiergate_home):
    """x86 (one look, early stop off) REJECTs on every sample while arm64's first chunk still runs: the gate's
    verdict is REJECT whatever arm64 shows, so arm64's run is stopped, nothing of it is recorded as a failure, no
    further chunk runs, and the decision says arm64 was stopped (an inconclusive "stopped" check, not a verdict)."""
    case = _case(tmp_path, 400, "random")
    backend = HeldBackend(ARM)
    # a slot for every run at once: x86's waits for a held arm64 run, which must not hold the slot x86 needs
    run, _ = _gate(case, load_policy(None), targets=(X86, ARM), backend=backend, early_stop=None, max_parallel=8)
    d = run.decision
    assert d.verdict == REJECT
    assert d.early_stop[X86].verdict == REJECT and not d.early_stop[X86].stopped_by
    arm = d.early_stop[ARM]
    assert (arm.stopped_by, arm.look, arm.samples_used) == (X86, 0, 0)
    assert backend.stopped and {role for role, _ in backend.stopped} <= {"candidate", "reference"}
    assert len({j.data_sha256 for j in backend.jobs if j.device_class.name == ARM}) == 1     # no second chunk
    stopped = [c for c in d.checks if c.device_class == ARM]
    assert [(c.name, c.inconclusive, c.passed) for c in stopped] == [("stopped", True, False)]
    assert "x86_64-cpu-onnxruntime's REJECT is final" in stopped[0].detail
    assert not any(key[1] == ARM for key in run.run_dirs)        # no run of arm64 stands for a result
    root = state.runs_root()
    assert not [p for p in root.iterdir() if p.name.endswith(state.SHARDS_SUFFIX)]     # nothing half-written kept
    assert Decision.from_json(json.loads(d.dumps())) == d
    # with early decision off every tier runs to its end, and the verdict is the same
    full, _ = _gate(case, load_policy(None), targets=(X86, ARM), early_stop=False)
    assert full.decision.verdict == REJECT
    assert {c.device_class for c in full.decision.checks if c.name == "accuracy_ratio" and not c.passed} == {X86, ARM}


def _dynamic_classes(path):
    """The model at `path` with its output's class dimension left open (its class count is known only from its
    outputs, as a detector's input-dependent map): written beside it."""
    import onnx

    model = onnx.load(str(path))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "classes"
    return modelkit.write(model, path.with_name(f"dyn-{path.name}"))


@pytest.mark.parametrize("outputs", ["fixed", "dynamic"])
def test_a_final_reject_stops_the_other_tiers_without_looks_and_with_labels_of_a_dynamic_output(
        tmp_path, tiergate_home, outputs):
    """Too few samples for any early look (32): each tier runs every sample at once, yet x86's final REJECT still
    stops arm64's run; likewise where the labels can be checked only against the reference's outputs (a dynamic
    output shape): they are checked on x86's reference run, which runs beside its candidate, not before every
    class's candidates (issue 46)."""
    cand, ref, data = _case(tmp_path, 32, "random")
    if outputs == "dynamic":
        cand, ref = _dynamic_classes(cand), _dynamic_classes(ref)
    backend = HeldBackend(ARM)
    run, _ = _gate((cand, ref, data), load_policy(None), targets=(X86, ARM), backend=backend, early_stop=None,
                   max_parallel=8)
    d = run.decision
    assert d.verdict == REJECT
    assert (d.early_stop[X86].verdict, d.early_stop[X86].looks, d.early_stop[X86].samples_used) == (REJECT, 1, 32)
    assert (d.early_stop[ARM].stopped_by, d.early_stop[ARM].looks, d.early_stop[ARM].samples_used) == (X86, 1, 0)
    assert backend.stopped and [c.name for c in d.checks if c.device_class == ARM] == ["stopped"]


def test_a_promote_stops_no_tier(tmp_path, tiergate_home):
    """A near-identical candidate: no tier REJECTs, so no tier is stopped (a PROMOTE settles only its own tier)."""
    case = _case(tmp_path, 400, "near")
    run, backend = _gate(case, load_policy(None), targets=(X86, ARM), early_stop=None)
    assert run.decision.verdict in (PROMOTE, INCONCLUSIVE)
    assert not any(t.stopped_by for t in run.decision.early_stop.values())
    assert not any(c.name == "stopped" for c in run.decision.checks)


def _nan_model(w, path, at: float = 50.0):
    """softmax(x W), and NaN in every output of a sample whose first feature is over `at` (sqrt of a negative):
    the near candidate's outputs on every other sample."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Slice", ["x", "s0", "s1", "ax"], ["x0"]),
             helper.make_node("Sub", ["at", "x0"], ["gap"]), helper.make_node("Sqrt", ["gap"], ["root"]),
             helper.make_node("Mul", ["root", "zero"], ["nan_or_zero"]),
             helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Add", ["logits", "nan_or_zero"],
                                                                                  ["sum"]),
             helper.make_node("Softmax", ["sum"], ["probs"], axis=1)]
    inits = [numpy_helper.from_array(np.asarray(v, dtype), n) for n, v, dtype in (
        ("s0", [0], np.int64), ("s1", [1], np.int64), ("ax", [1], np.int64), ("at", at, np.float32),
        ("zero", 0.0, np.float32), ("w", w, np.float32))]
    graph = helper.make_graph(nodes, "nan-late", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_an_early_promote_says_which_samples_its_point_checks_covered(tmp_path, tiergate_home):
    """Issue 42: an early PROMOTE judged `finite`, `output_shape` and `max_abs_error` on the samples looked at only,
    and said nothing of it: a NaN in the rest was never seen. Each such check now names its coverage, and so does
    the tier's note; the same gate on every sample finds the NaN."""
    cand, ref, data = _case(tmp_path, 2400, "near")
    x = np.load(data)["x"].copy()
    w = np.random.default_rng(5).normal(size=(8, 4))
    poisoned = None
    for row in range(len(x) - 1, -1, -1):           # a sample of the half the first looks never run
        x[row, 0] = 100.0
        np.savez(data, x=x, labels=(x @ w).argmax(1).astype(np.int64))
        run, backend = _gate((_nan_model(w, tmp_path / "nan.onnx"), ref, data), _policy(tmp_path, FOUR),
                             early_stop=True)
        seen = any((np.load(j.data_npz)["x"][:, 0] == 100.0).any() for j in backend.jobs if j.role == "candidate")
        if not seen:
            poisoned = row
            break
        x[row, 0] = 0.5
    assert poisoned is not None
    d = run.decision
    tier = d.early_stop[X86]
    assert d.verdict == PROMOTE and tier.stopped_early and tier.samples_used < tier.samples_total
    finite = [c for c in d.checks if c.name == "finite"]
    assert finite and all(f"on the {tier.samples_used} of {tier.samples_total} samples looked at" in c.detail
                          for c in finite)
    assert any("point checks" in n and "covered those samples only" in n for n in d.notes)
    whole, _ = _gate((_nan_model(w, tmp_path / "nan.onnx"), ref, data), _policy(tmp_path, FOUR), early_stop=False)
    assert whole.decision.verdict == REJECT and any(c.name == "finite" and not c.passed
                                                    for c in whole.decision.checks)
