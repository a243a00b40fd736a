"""Faults of input and environment caught before any container starts, and the errors' exit codes.

Each case: the fault, the exit code and one line, and what was not lost (nothing ran, nothing written).
"""

from __future__ import annotations

import errno

import numpy as np
import pytest

from faultkit import ARM, X86, cli, error_lines
from fakes import FakeBackend, FakeBuilder
import gatekit
from tiergate import orchestrator
from tiergate.evaldata import label_classes
from tiergate.errors import EnvironmentProblem, InputError
from tiergate.policy import load_policy
from tiergate.targets import resolve

pytestmark = pytest.mark.faults


def _gate(case, candidate="good", data=None, policy=None, backend=None, builder=None, registry=None):
    backend, builder = backend or FakeBackend(), builder or FakeBuilder()
    seams = orchestrator.Seams(builder=builder, backend_for=backend, janitor=lambda dcs: None)
    run = gatekit.gate(case[candidate], case["reference"], data or case["data"], resolve([X86, ARM]),
                        policy or load_policy(None), seams=seams, registry=registry)
    return run, backend, builder


# --- policy values -------------------------------------------------------------------------
@pytest.mark.parametrize("line, message", [
    ("min_cosine = nan", "must be a finite number"),
    ("min_cosine = inf", "must be a finite number"),
    ("min_cosine = 1.5", "between"),
    ("bootstrap_resamples = 1000000000", "between"),
    ("min_accuracy_ratio = 2.0", "between"),
])
def test_policy_values_are_finite_and_bounded(tmp_path, line, message):
    policy = tmp_path / "policy.toml"
    policy.write_text(f"[defaults]\n{line}\n")
    code, out, err = cli("gate", "-c", "a.onnx", "-r", "b.onnx", "-d", "d.npz", "-t", X86, "--policy", str(policy))
    assert code == 2 and out == ""
    assert len(error_lines(err)) == 1 and message in err and str(policy) in err


# --- evaluation data: sample count and labels, before anything is built -----------------------
def test_a_single_sample_is_refused_before_any_build(case, tmp_path):
    one = tmp_path / "one.npz"
    np.savez(one, x=case["x"][:1], labels=case["labels"][:1])
    builder, backend = FakeBuilder(), FakeBackend()
    with pytest.raises(InputError, match=r"1 sample\(s\), but the gate needs at least 20"):
        _gate(case, data=one, builder=builder, backend=backend)
    assert builder.calls == [] and backend.runs == []


def test_the_minimum_is_accepted_and_honestly_inconclusive_more_samples_promote(case, tmp_path):
    twenty = tmp_path / "twenty.npz"        # the fewest the policy accepts: 20 identical answers prove little
    np.savez(twenty, x=case["x"][:20], labels=case["labels"][:20])
    run, _, _ = _gate(case, data=twenty)
    assert run.decision.verdict == "INCONCLUSIVE", run.decision.reasons
    (check,) = [c for c in run.decision.checks if c.name == "accuracy_ratio"][:1]
    assert check.inconclusive and check.interval.low < 0.99 and check.samples_needed > 20
    run, _, _ = _gate(case)                 # 400 identical answers resolve the 0.99 ratio
    assert run.decision.verdict == "PROMOTE", run.decision.reasons


def test_labels_outside_the_class_count_are_refused_before_any_build(case, tmp_path):
    bad = tmp_path / "bad-labels.npz"
    labels = case["labels"].copy()
    labels[3] = 7                                   # the classifier has 4 classes
    np.savez(bad, x=case["x"], labels=labels)
    builder, backend = FakeBuilder(), FakeBackend()
    with pytest.raises(InputError, match=r"label 7 is outside output 'probs', which has 4 classes"):
        _gate(case, data=bad, builder=builder, backend=backend)
    assert builder.calls == [] and backend.runs == []


def test_labels_of_a_dynamic_output_are_refused_on_the_first_reference_run_and_stop_every_class(case, tmp_path):
    """The class count is known only from the reference's outputs: the labels are checked on the first reference
    run that ends (x86's, while arm64's still runs), before anything is judged, and arm64's run is stopped."""
    import modelkit
    from fakes import HeldBackend

    rng = np.random.default_rng(3)
    model = modelkit.mlp(seed=1)
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "classes"   # class count unknown statically
    ref = modelkit.write(model, tmp_path / "dyn-ref.onnx")
    from tiergate.artifact import load_artifact

    assert label_classes(load_artifact(ref).outputs) is None
    x = rng.normal(size=(40, 8)).astype(np.float32)
    bad = tmp_path / "dyn.npz"
    np.savez(bad, x=x, labels=np.full(40, 9, dtype=np.int64))
    backend = HeldBackend(ARM)
    with pytest.raises(InputError, match="label 9 is outside"):
        _gate({**case, "reference": ref, "good": ref}, data=bad, backend=backend)
    assert [name for _, name in backend.runs] == [X86]              # arm64's run was held until it was stopped
    assert [name for _, name in backend.stopped] == [ARM]


# --- output folders ------------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["--report-dir", "--junit"])
def test_an_unwritable_output_folder_is_refused_before_the_gate(case, option):
    target = "/proc/nope" if option == "--report-dir" else "/proc/nope/junit.xml"
    code, out, err = cli("gate", "-c", str(case["good"]), "-r", str(case["reference"]), "-d", str(case["data"]),
                         "-t", X86, option, target, env={"TIERGATE_HOME": str(case["home"])})
    assert code == 2, err
    assert error_lines(err) == [f"tiergate: error: {option} {target.rsplit('/', 1)[0] if option == '--junit' else target}"
                                f": cannot write there ({err.split('(', 1)[1].split(')')[0]})"]
    assert not (case["home"] / "runs").exists()          # nothing ran


# --- CLI usage errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["gate", "--bogus"], "No such option: --bogus"),
    (["gate"], "Missing option"),
    (["register"], "Missing argument"),
    (["no-such-command"], "No such command"),
])
def test_usage_errors_exit_2_with_the_usage_line(args, message):
    code, out, err = cli(*args)
    assert code == 2
    assert err.splitlines()[0].startswith("Usage: tiergate")
    assert message in err and "internal error" not in err


# --- disk full -------------------------------------------------------------------------------------
def test_disk_full_during_a_run_is_exit_2_and_leaves_no_part_folder(case, monkeypatch):
    from tiergate import results

    real_save = results.save

    def full(result, folder):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder))

    monkeypatch.setattr(results, "save", full)
    with pytest.raises(EnvironmentProblem, match="disk full") as caught:
        _gate(case)
    assert caught.value.exit_code == 2
    runs = case["home"] / "runs"
    left = [p for p in runs.rglob("*") if ".part-" in p.name] if runs.exists() else []
    assert not left, left
    monkeypatch.setattr(results, "save", real_save)
    run, _, _ = _gate(case)                                # nothing half-written blocks the next gate
    assert run.decision.verdict == "PROMOTE"


def test_disk_full_inside_the_backend_is_not_a_verdict(case):
    class FullBackend(FakeBackend):
        def run(self, job):
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(EnvironmentProblem, match="disk full"):
        _gate(case, backend=FullBackend())
    assert not list((case["home"] / "runs").glob("*.part-*"))


def test_disk_full_writing_the_decision_leaves_no_part_file(case, monkeypatch):
    from pathlib import Path

    real = Path.write_text

    def full(self, *a, **k):
        if ".part-" in self.name:
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(EnvironmentProblem, match="disk full"):
        _gate(case)
    assert not list((case["home"] / "decisions").glob("*.part-*"))


@pytest.mark.root
def test_disk_full_through_the_cli_is_one_line(case, tmp_path):
    """A real full disk: TIERGATE_HOME on a 1 MiB tmpfs (root only), the eval data large enough to fill it."""
    import subprocess

    from partskit import tiny_tmpfs

    mount = tiny_tmpfs(tmp_path / "tiny")
    try:
        code, out, err = cli("register", str(case["good"]), "--model", "m", "--reference", str(case["reference"]),
                             "--registry", f"sqlite:///{tmp_path / 'r.db'}", "--store", str(mount / "store"),
                             env={"TIERGATE_HOME": str(case["home"])})
        filler = mount / "fill"
        with open(filler, "wb") as fh:
            try:
                fh.write(b"\0" * (1 << 20))
            except OSError:
                pass
        code, out, err = cli("register", str(case["bad"]), "--model", "m", "--reference", str(case["reference"]),
                             "--registry", f"sqlite:///{tmp_path / 'r.db'}", "--store", str(mount / "store"),
                             env={"TIERGATE_HOME": str(case["home"])})
        assert code == 2, err
        assert len(error_lines(err)) == 1 and "disk full" in err
        assert not [p for p in mount.rglob("*") if ".part-" in p.name]
    finally:
        subprocess.run(["umount", str(mount)])
