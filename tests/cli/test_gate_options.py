"""`tiergate gate` as a person and a CD job use it: the human-readable output, every option, the error branches.

Real Docker on x86_64 with tiny generated classifiers (the runtime image is shared with the rest of the suite).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import modelkit
from tiergate.cli.main import main

pytestmark = pytest.mark.docker
X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gate-options")
    rng = np.random.default_rng(7)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    np.savez(folder / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    write = lambda name, weights: modelkit.write(modelkit.linear(weights, softmax=True), folder / name)  # noqa: E731
    return {"ref": write("ref.onnx", w), "good": write("good.onnx", w + rng.normal(0, 1e-4, w.shape)),
            "bad": write("bad.onnx", rng.normal(size=w.shape)), "data": folder / "eval.npz", "folder": folder}


def _gate(capsys, m, candidate="good", *extra):
    code = main(["gate", "--candidate", str(m[candidate]), "--reference", str(m["ref"]), "--data", str(m["data"]),
                 "--targets", X86, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_human_output_lists_checks_reasons_runs_and_the_verdict(models, capsys, tiergate_home):
    code, out, err = _gate(capsys, models, "good")
    assert code == 0, err
    assert "tiergate gate: PROMOTE" in out and "accuracy_ratio" in out and X86 in out
    assert "runs: 2 started, 0 reused from cache" in out
    assert "runtime graph of the candidate" in out and "MatMul" in out
    assert out.rstrip().splitlines()[-1] == "PROMOTE" and "reason:" not in out

    code, out, err = _gate(capsys, models, "bad")
    assert code == 1
    reasons = [line for line in out.splitlines() if line.startswith("reason:")]
    assert reasons and all(X86 in r for r in reasons) and any("accuracy_ratio" in r for r in reasons)
    assert "runs: 1 started, 1 reused from cache" in out        # the FP32 reference's run was reused
    assert out.rstrip().splitlines()[-1] == "REJECT"


def test_registry_and_incumbent_record_an_ab_decision(models, capsys, tiergate_home, tmp_path):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    for name in ("good", "bad"):
        assert main(["register", str(models[name]), "--model", "clf", "--reference", str(models["ref"]),
                     "--registry", url]) == 0
    capsys.readouterr()
    policy = tmp_path / "policy.toml"     # this test is about recording: latency noise on a busy machine is not
    policy.write_text("[defaults]\nmax_latency_regression = 1000.0\n")
    code, out, err = _gate(capsys, models, "good", "--incumbent", str(models["bad"]), "--registry", url, "--json",
                           "--max-parallel", "1", "--policy", str(policy))
    doc = json.loads(out)
    assert code == 0, doc["reasons"]
    assert doc["containers_started"] == 3
    check = next(c for c in doc["checks"] if c["name"] == "noninferior_accuracy")
    assert check["passed"] and doc["metrics"][X86]["ab"]["accuracy_difference"]["estimate"] > 0.3
    from tiergate.hashing import file_sha256
    from tiergate.registry import Registry

    with Registry(url) as registry:
        recorded = registry.decisions(artifact_sha=file_sha256(models["good"]))
        assert [d.verdict for d in recorded] == ["promote"]
        assert registry.alias("clf", "x86-server").sha256 == file_sha256(models["good"])
        assert recorded[0].detail["runtime"][X86]["ok"] is True
    # unchanged: the recorded decision is reused, not duplicated
    code, out, _ = _gate(capsys, models, "good", "--incumbent", str(models["bad"]), "--registry", url, "--json",
                         "--policy", str(policy))
    assert code == 0 and json.loads(out)["decision_cached"] is True
    with Registry(url) as registry:
        assert len(registry.decisions(artifact_sha=file_sha256(models["good"]))) == 1


@pytest.mark.parametrize("extra, message", [
    (["--max-parallel", "0"], "Invalid value for '--max-parallel'"),
    (["--ca-bundle", "/nonexistent/ca.pem"], "/nonexistent/ca.pem: CA bundle does not exist"),
    (["--base-image", "tiergate/no-such-base:1"], "tiergate/no-such-base:1"),
    (["--policy", "/nonexistent/policy.toml"], "/nonexistent/policy.toml"),
    (["--targets", "no-such-class"], "no-such-class"),
])
def test_bad_options_exit_2_with_one_line(models, capsys, tiergate_home, extra, message):
    code, out, err = _gate(capsys, models, "good", *extra)
    errors = [line for line in err.strip().splitlines()       # "…": progress lines; a usage error shows the usage
              if not line.startswith("…") and not line.startswith("Usage: tiergate gate")]
    assert code == 2 and len(errors) == 1 and errors[0].startswith("tiergate: error:") and message in errors[0], err
    assert "Traceback" not in err and "internal error" not in err and out == ""


def test_a_ca_bundle_that_is_not_pem_is_refused(models, capsys, tiergate_home, tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("not a certificate")
    code, _, err = _gate(capsys, models, "good", "--ca-bundle", str(bundle))
    assert code == 2 and "not a PEM CA bundle" in err


def test_runtime_lint_of_the_candidate_is_shown_with_its_tier(capsys, tiergate_home, tmp_path):
    """A no-op Clip before a BatchNormalization (issue 24): the outputs are the same, so the gate promotes, and it
    says that the tier's runtime runs the normalization as its own kernel, naming the tier and its level."""
    ref = modelkit.save(modelkit.conv_net(batchnorm=True, channels=16), "ref.onnx", tmp_path)
    cand = modelkit.save(modelkit.conv_net(batchnorm=True, noop_clip=True, channels=16), "cand.onnx", tmp_path)
    np.savez(tmp_path / "eval.npz", x=np.random.default_rng(0).standard_normal((40, 3, 8, 8)).astype(np.float32))
    code = main(["gate", "--candidate", str(cand), "--reference", str(ref), "--data", str(tmp_path / "eval.npz"),
                 "--targets", X86])
    out, err = capsys.readouterr()
    assert code == 0, err
    text = " ".join(out.split())        # rich wraps at the console's width
    assert text.count("unfolded-batchnorm") == 1
    assert f"warning {X86}: unfolded-batchnorm: [{X86}: onnxruntime level all] 1 normalization(s)" in text
