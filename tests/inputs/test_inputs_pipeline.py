"""Real inputs through the orchestrator with in-memory fakes (the real harness feeding, no Docker): data loaders,
non-leading sample axes and constants, the signature check, task metrics, INCONCLUSIVE and exit 3."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort
import pytest

import modelkit
from fakes import FakeBackend, FakeBuilder
import gatekit
from tiergate import paths
from tiergate import orchestrator
from tiergate.cli.main import main
from tiergate.errors import InputError
from tiergate.evaldata import load_eval_data
from tiergate.gate import INCONCLUSIVE, PROMOTE, REJECT
from tiergate.policy import load_policy
from tiergate.targets import resolve

X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"
N = 24

LOADER = '''
import numpy as np

def samples():
    rng = np.random.default_rng(3)
    for i in range({n}):
        yield ({{"input": rng.normal(size=(1, 8)).astype(np.float32),
                 "state": rng.normal(size=(2, 1, 4)).astype(np.float32),
                 "sr": np.array(16000, np.int64)}}, int(i % 2))

def broken():
    yield {{"input": np.zeros((1, 8), np.float32), "state": np.zeros((2, 1, 4), np.float32), "sr": np.array(16000)}}
    raise RuntimeError("disk on fire")

def nothing():
    return []

def misnamed():
    yield {{"input": np.zeros((1, 8), np.float32), "stat": np.zeros((2, 1, 4), np.float32), "sr": np.array(16000)}}

def misshapen():
    for i in range(3):
        yield {{"input": np.zeros((1, 8), np.float32), "state": np.zeros((2, 1, 4 + i // 2), np.float32),
               "sr": np.array(16000)}}

def wrong_dtype():
    yield {{"input": np.zeros((1, 8), np.float64), "state": np.zeros((2, 1, 4), np.float32), "sr": np.array(16000)}}

def varying_constant():
    for i in range(2):
        yield {{"input": np.zeros((1, 8), np.float32), "state": np.zeros((2, 1, 4), np.float32),
               "sr": np.array(8000 * (i + 1))}}

def raises():
    raise ValueError("no such bucket")
'''


@pytest.fixture
def case(tmp_path, tiergate_home):
    loader = tmp_path / "vad_data.py"
    loader.write_text(LOADER.format(n=N))
    return {"model": modelkit.write(modelkit.stateful(), tmp_path / "vad.onnx"),
            "no_sr": modelkit.write(modelkit.stateful(with_sr=False), tmp_path / "vad-no-sr.onnx"),
            "loader": loader, "folder": tmp_path}


def _gate(candidate, reference, data, *, policy=None, backend=None, builder=None, **kw):
    backend, builder = backend or FakeBackend(), builder or FakeBuilder()
    run = gatekit.gate(candidate, reference, data, resolve([X86, ARM]), policy or load_policy(None),
                        seams=orchestrator.Seams(builder=builder, backend_for=backend), **kw)
    return run, backend, builder


def _direct(model, x, state, sr):
    """The model run by hand one sample per call: the truth the harness's feeding must reproduce."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    outs = [session.run(None, {"input": x[i:i + 1], "state": state[:, i:i + 1], "sr": sr}) for i in range(len(x))]
    return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs], axis=1)


def test_a_loader_feeds_state_on_axis_1_and_sr_as_a_constant(case):
    run, backend, _ = _gate(case["model"], case["model"], f"{case['loader']}:samples", metrics=["f1"])   # binary labels: a VAD figure
    assert run.decision.verdict == PROMOTE, run.decision.reasons
    (archive,) = (paths.home() / "data").glob("*.npz")          # materialised once, named by content
    data = load_eval_data(archive)
    assert archive.name.removesuffix(".npz") == data.sha256[:32]
    assert data.axes == {"input": 0, "state": 1, "sr": None} and data.n_samples == N
    assert data.arrays["state"].shape == (2, N, 4) and data.arrays["sr"].shape == ()
    assert data.labels.tolist() == [i % 2 for i in range(N)]
    outcome = orchestrator.load_outcomes(run.run_dirs)["candidate"][X86]
    output, state_n = _direct(case["model"], data.arrays["input"], data.arrays["state"], data.arrays["sr"])
    np.testing.assert_allclose(outcome.outputs["output"], output, rtol=1e-6)
    # stateN has its batch on axis 1: stored sample-first, compared per sample
    np.testing.assert_allclose(outcome.outputs["stateN"], np.moveaxis(state_n, 1, 0), rtol=1e-6)
    assert run.decision.metrics[X86].outputs["stateN"].n_samples == N


def test_the_loader_runs_once_into_a_content_hashed_archive_so_runs_are_cached(case):
    first, _, _ = _gate(case["model"], case["model"], f"{case['loader']}:samples", metrics=["f1"])
    second, backend, _ = _gate(case["model"], case["model"], f"{case['loader']}:samples", metrics=["f1"])
    assert backend.runs == [] and second.cache_hits == 4
    assert len(list((paths.home() / "data").glob("*.npz"))) == 1


def test_an_npz_with_the_batch_on_axis_1_and_a_0d_constant_gives_the_same_outputs(case):
    rng = np.random.default_rng(5)
    x, state = rng.normal(size=(N, 8)).astype(np.float32), rng.normal(size=(2, N, 4)).astype(np.float32)
    path = case["folder"] / "vad.npz"
    np.savez(path, input=x, state=state, sr=np.array(16000, np.int64))
    run, _, _ = _gate(case["model"], case["model"], path)
    assert run.decision.verdict == PROMOTE, run.decision.reasons
    outcome = orchestrator.load_outcomes(run.run_dirs)["reference"][ARM]
    output, state_n = _direct(case["model"], x, state, np.array(16000, np.int64))
    np.testing.assert_allclose(outcome.outputs["output"], output, rtol=1e-6)
    np.testing.assert_allclose(outcome.outputs["stateN"], np.moveaxis(state_n, 1, 0), rtol=1e-6)


def test_an_explicit_sample_axis_wins(case):
    rng = np.random.default_rng(5)
    path = case["folder"] / "vad.npz"
    np.savez(path, input=rng.normal(size=(N, 8)).astype(np.float32),
             state=rng.normal(size=(2, N, 4)).astype(np.float32), sr=np.array(16000, np.int64))
    with pytest.raises(InputError, match=r"arrays disagree on the number of samples \('input' 24, 'state' 2\)"):
        _gate(case["model"], case["model"], path, sample_axes={"state": 0})


@pytest.mark.parametrize("function, message", [
    ("broken", "sample 1: raised RuntimeError: disk on fire"),
    ("nothing", "yielded no samples"),
    ("misnamed", "sample 0: 'stat' is not a model input"),
    ("misshapen", "sample 2: input 'state' has shape (2, 1, 5), one call's is (2, 1, 4) (axis 2 is 5, must be 4)"),
    ("wrong_dtype", "sample 0: input 'input' has dtype float64, the model wants float32"),
    ("varying_constant", "sample 1: input 'sr' differs from sample 0's"),
    ("raises", "raised ValueError: no such bucket"),
    ("missing_function", "defines no function missing_function()"),
])
def test_loader_problems_are_one_line_naming_the_sample_and_input(case, function, message):
    with pytest.raises(InputError) as err:
        _gate(case["model"], case["model"], f"{case['loader']}:{function}")
    assert message in err.value.one_line() and "\n" not in err.value.one_line()


def test_loader_errors_exit_2_through_the_cli(case, capsys):
    code = main(["gate", "-c", str(case["model"]), "-r", str(case["model"]), "-d", f"{case['loader']}:misnamed",
                 "-t", X86])
    assert code == 2 and "sample 0: 'stat' is not a model input" in capsys.readouterr().err


def test_a_candidate_without_sr_is_a_signature_finding_before_anything_runs(case):
    run, backend, builder = _gate(case["no_sr"], case["model"], f"{case['loader']}:samples")
    decision = run.decision
    assert decision.verdict == REJECT and decision.exit_code == 1
    assert [c.name for c in decision.checks] == ["signature"]
    assert "input 'sr' int64[] of the reference is missing" in decision.reasons[0]
    assert backend.runs == [] and builder.calls == []


def test_signature_differences_name_dtype_shape_and_renames(case, tmp_path):
    import onnx

    model = modelkit.stateful()
    model.graph.output[1].name = "state_out"
    model.graph.node[-1].output[0] = "state_out"
    model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    model.graph.input[1].type.tensor_type.shape.dim[2].dim_value = 5
    path = tmp_path / "changed.onnx"
    onnx.save(model, path)
    found = orchestrator.signature_differences({"candidate": orchestrator.intake(path), "reference": orchestrator.intake(case["model"])})
    texts = [t for _, t in found]
    assert "input 'input' is float16, the reference's is float32" in texts
    assert "input 'state' has shape float32[2, ?, 5], the reference's float32[2, ?, 4]" in texts
    assert "output 'stateN' float32[2, ?, 4] of the reference is missing" in texts
    assert "output 'state_out' float32[2, ?, 4] is not in the reference" in texts


def _classifier_case(folder, n, p_ref=0.9, cand_loses=0.015, cand_gains=0.011, seed=0):
    """Labels and two fixed 'models' (lookup tables via the data): the reference right with p_ref, the candidate
    differing on a known fraction of samples (a small effect: true ratio (p - loses + gains) / p)."""
    rng = np.random.default_rng(seed)
    ref_ok = rng.random(n) < p_ref
    u = rng.random(n)
    cand_ok = np.where(ref_ok, u >= cand_loses / p_ref, u < cand_gains / (1 - p_ref))
    labels = rng.integers(0, 4, n)
    onehot = lambda ok: np.eye(4, dtype=np.float32)[np.where(ok, labels, (labels + 1) % 4)]  # noqa: E731
    return labels, onehot(ref_ok), onehot(cand_ok)


def test_a_small_effect_is_inconclusive_with_a_sample_size_a_larger_run_confirms(make_outcome_dc):
    from tiergate.gate import evaluate

    make, classes = make_outcome_dc
    labels, ref, cand = _classifier_case(None, 400)
    small = evaluate({X86: make(X86, cand)}, {X86: make(X86, ref)}, classes, load_policy(None), labels)
    check = next(c for c in small.checks if c.name == "accuracy_ratio")
    assert small.verdict == INCONCLUSIVE and small.exit_code == 3 and check.inconclusive
    assert check.interval.low < 0.99 <= check.interval.high and check.samples_needed > 400
    assert f"needs about {check.samples_needed} samples" in small.reasons[0]
    task = small.metrics[X86].task["top1_accuracy"]
    assert task.outcome == "inconclusive" and task.samples_needed == check.samples_needed
    # the estimate is made at the observed effect (0.98 here: it says how many samples would reject that); the
    # process's true ratio is (0.9 - 0.015 + 0.011) / 0.9 = 0.9956. The same estimator on the process's expected
    # pairs says how many samples promote it; twice that many do
    from tiergate import stats

    expected = stats.PairCounts(885, 11, 15, 1000)
    needed = stats.paired_samples_needed(expected, "ratio", ">=", 0.99, check.interval.confidence)
    assert needed > 1000
    labels, ref, cand = _classifier_case(None, 2 * needed, seed=1)
    large = evaluate({X86: make(X86, cand)}, {X86: make(X86, ref)}, classes, load_policy(None), labels)
    big = next(c for c in large.checks if c.name == "accuracy_ratio")
    assert large.verdict == PROMOTE, large.reasons
    assert big.interval.low >= 0.99 and big.interval.high - big.interval.low < check.interval.high - check.interval.low


@pytest.mark.parametrize("mode, verdict", [("reject", REJECT), ("promote", PROMOTE), ("inconclusive", INCONCLUSIVE)])
def test_on_inconclusive_makes_it_binary_for_cd(make_outcome_dc, tmp_path, mode, verdict):
    from tiergate.gate import evaluate

    make, classes = make_outcome_dc
    labels, ref, cand = _classifier_case(None, 400)
    path = tmp_path / "p.toml"
    path.write_text(f'[defaults]\non_inconclusive = "{mode}"\n')
    decision = evaluate({X86: make(X86, cand)}, {X86: make(X86, ref)}, classes, load_policy(path), labels)
    assert decision.verdict == verdict and any(c.inconclusive for c in decision.checks)


def test_inconclusive_exits_3_through_the_cli_and_is_recorded_without_moving_an_alias(case, tmp_path, capsys,
                                                                                       monkeypatch):
    from tiergate.registry import Registry

    labels, ref, cand = _classifier_case(None, 400)
    # identity classifiers fed the reference's scores; the fake backend gives the candidate its own outputs
    data = tmp_path / "scores.npz"
    np.savez(data, x=ref, labels=labels)
    identity = modelkit.write(modelkit.linear(np.eye(4), output_name="probs"), tmp_path / "identity.onnx")
    scaled = modelkit.write(modelkit.linear(np.eye(4) * 1.0001, output_name="probs"), tmp_path / "scaled.onnx")
    backend = FakeBackend(outputs_for={"candidate": {"probs": cand}})
    gatekit.fake_cli_seams(monkeypatch, FakeBuilder(), backend)
    from tiergate.registry.intake import register_artifact

    url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(url) as registry:
        register_artifact(registry, scaled, model="scores", reference=identity)
    code = main(["gate", "-c", str(scaled), "-r", str(identity), "-d", str(data), "-t", X86, "--registry", url])
    out, err = capsys.readouterr()
    assert code == 3, err + out
    assert "INCONCLUSIVE" in out and "needs about" in out
    with Registry(url) as registry:
        (decision,) = registry.decisions()
        assert decision.verdict == "inconclusive" and decision.tiers == [resolve([X86])[0].tier]
        assert registry.alias(decision.model, decision.tiers[0]) is None       # no alias moved


@pytest.fixture
def make_outcome_dc():
    from tiergate.results import TargetResult
    from tiergate.gate import RunOutcome
    from tiergate.targets import resolve

    def make(name, outputs):
        n = len(outputs)
        return RunOutcome(TargetResult(device_class=name, status="ok", latencies_ns=[1000] * n, n_samples=n),
                          {"probs": outputs})
    return make, {dc.name: dc for dc in resolve([X86])}


def test_a_carried_state_output_is_never_scored_as_classes(tmp_path, tiergate_home):
    """silero-like: with class labels, top-1 must not be computed on `stateN` (the state fed back as `state`)."""
    from fakes import FakeBackend, FakeBuilder

    import modelkit as mk
    from tiergate import orchestrator
    from tiergate.artifact import load_artifact
    from tiergate.policy import load_policy
    from tiergate.targets import resolve

    model = mk.save(mk.stateful(), "stateful.onnx", tmp_path)
    assert orchestrator.carried_outputs(load_artifact(model)) == {"stateN"}
    assert orchestrator.carried_outputs(load_artifact(mk.save(mk.classifier(), "clf.onnx", tmp_path))) == set()
    rng = np.random.default_rng(0)
    n = 40
    np.savez(tmp_path / "d.npz", input=rng.normal(size=(n, 8)).astype(np.float32),
             state=np.zeros((2, n, 4), np.float32), sr=np.array(16000, np.int64),
             labels=rng.integers(0, 2, n).astype(np.int64))
    gate = functools.partial(gatekit.gate, model, model, tmp_path / "d.npz", resolve(["x86_64-cpu-onnxruntime"]),
                             load_policy(), seams=orchestrator.Seams(builder=FakeBuilder(), backend_for=FakeBackend()))
    from tiergate.errors import InputError

    with pytest.raises(InputError, match="no model output has two or more scores"):   # not top-1 on stateN
        gate()
    run = gate(metrics=["f1"])
    assert run.decision.metrics["x86_64-cpu-onnxruntime"].label_output is None
    assert [c.output for c in run.decision.checks if c.name.startswith("f1")] == ["output"]
