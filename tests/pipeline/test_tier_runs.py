"""One container per tier and shard on the real engine: candidate and reference share a container start, shards
merge to the same outputs, and batched emulated evaluation gives the unbatched path's verdict and metrics."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import modelkit
import gatekit
from tiergate import results
from tiergate.paths import targets_dir
from tiergate.policy import load_policy
from tiergate.targets import resolve

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1200)]
X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"


@pytest.fixture
def case(tmp_path):
    rng = np.random.default_rng(5)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(300, 8)).astype(np.float32)
    data = tmp_path / "eval.npz"
    np.savez(data, x=x, labels=(x @ w).argmax(1).astype(np.int64))
    ref = modelkit.write(modelkit.linear(w, softmax=True, output_name="probs"), tmp_path / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + rng.normal(0, 0.05, w.shape), softmax=True, output_name="probs"),
                          tmp_path / "cand.onnx")
    return {"reference": ref, "candidate": cand, "data": data}


def _gate(case, classes, **options):
    return gatekit.gate(case["candidate"], case["reference"], case["data"], resolve(classes), load_policy(None),
                         **options)


def _container(run, role, dc):
    return results.load(run.run_dirs[(role, dc)]).extra["container"]


def test_candidate_and_reference_share_one_container_and_shards_merge_exactly(case, tiergate_home, monkeypatch,
                                                                             tmp_path):
    whole = _gate(case, [X86])
    one = _container(whole, "candidate", X86)
    assert one == _container(whole, "reference", X86) and one["artifacts"] == 2
    assert whole.containers_started == 2            # two artifact runs, in one container

    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "sharded-home"))
    split = _gate(case, [X86], shards=2)
    merged = results.load(split.run_dirs[("candidate", X86)])
    assert [s["samples"] for s in merged.extra["shards"]] == [[0, 150], [150, 300]]
    assert len(merged.latencies_ns) == 300 and merged.n_samples == 300
    for role in ("candidate", "reference"):
        a = results.load_outputs(whole.run_dirs[(role, X86)])["probs"]
        b = results.load_outputs(split.run_dirs[(role, X86)])["probs"]
        np.testing.assert_array_equal(a, b)
    assert split.decision.verdict == whole.decision.verdict
    assert [(c.name, c.value) for c in split.decision.checks if not c.name.startswith("latency")] == \
        [(c.name, c.value) for c in whole.decision.checks if not c.name.startswith("latency")]


@pytest.mark.emulated
@pytest.mark.slow
def test_batched_emulated_gate_equals_the_unbatched_path(case, tiergate_home, tmp_path, monkeypatch):
    """The arm64 class as shipped (outputs in calls of 64 made two at a time in one container, checked on 4 single
    calls) against the same class evaluating every sample in its own timed call: same verdict, same metrics per
    sample."""
    from fakes import harness
    catalogue = tmp_path / "targets"
    shutil.copytree(targets_dir(), catalogue)
    text = (catalogue / f"{ARM}.toml").read_text()
    assert "batch = 64" in text and "shards = 0" in text
    (catalogue / "arm64-unbatched.toml").write_text(text.replace("batch = 64", "batch = 0")
                                                    .replace("shards = 0", "shards = 1"))
    monkeypatch.setenv("TIERGATE_TARGETS_DIR", str(catalogue))
    monkeypatch.setattr("tiergate.targets.host.available_cores", lambda: 2)

    batched = _gate(case, [ARM], early_stop=False)      # one run of every sample each (not an early decision's looks)
    plain = _gate(case, ["arm64-unbatched"], early_stop=False)
    b = results.load(batched.run_dirs[("candidate", ARM)])
    p = results.load(plain.run_dirs[("candidate", "arm64-unbatched")])
    assert b.machine == p.machine == "aarch64"
    ev = b.extra["evaluation"]
    assert ev["batched"] and ev["eval_calls"] == len(harness()._plugin("harness_batched").eval_schedule(300, ev["eval_batch"], 2))
    assert ev["eval_workers"] == 2 and "shards" not in b.extra and len(b.latencies_ns) == 4   # one container
    assert ev["eval_at_once"] in (1, 2)      # the second run slot is granted once free (the gate's other runs)
    assert p.extra["evaluation"]["batched"] is False and len(p.latencies_ns) == 300 and "shards" not in p.extra
    for role in ("candidate", "reference"):
        out_b = results.load_outputs(batched.run_dirs[(role, ARM)])["probs"]
        out_p = results.load_outputs(plain.run_dirs[(role, "arm64-unbatched")])["probs"]
        np.testing.assert_allclose(out_b, out_p, rtol=1e-5, atol=1e-6)
        assert np.array_equal(out_b.argmax(1), out_p.argmax(1))
    assert batched.decision.verdict == plain.decision.verdict
    got = {c.name: c for c in batched.decision.checks if not c.name.startswith("latency")}
    want = {c.name: c for c in plain.decision.checks if not c.name.startswith("latency")}
    assert got.keys() == want.keys()
    for name, check in want.items():
        assert got[name].passed == check.passed and got[name].inconclusive == check.inconclusive, name
        if isinstance(check.value, float):
            assert got[name].value == pytest.approx(check.value, rel=1e-4, abs=1e-6), name
    assert batched.decision.metrics[ARM].accuracy == plain.decision.metrics["arm64-unbatched"].accuracy


def test_an_emulated_tier_s_artifacts_run_costliest_first(tmp_path):
    """One start with calls at once runs its artifacts one after another: the largest file first (an FP32 before
    its INT8, whose single-threaded start then fits beside the FP32's last calls); on a tie, the specs' order."""
    from types import SimpleNamespace

    from tiergate.orchestrator.spans import costliest_first

    def spec(name: str, size: int):
        path = tmp_path / name
        path.write_bytes(b"\0" * size)
        return SimpleNamespace(intake=SimpleNamespace(artifact=SimpleNamespace(path=path)))

    pending = {"int8": spec("int8.onnx", 100), "fp32": spec("fp32.onnx", 400), "other": spec("other.onnx", 100),
               "gone": SimpleNamespace(intake=SimpleNamespace(artifact=SimpleNamespace(path=tmp_path / "no")))}
    assert costliest_first(["int8", "fp32", "other", "gone"], pending) == ["fp32", "int8", "other", "gone"]
    assert costliest_first(["other", "int8"], pending) == ["other", "int8"]
