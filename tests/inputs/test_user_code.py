"""User code (data loaders, user metrics) runs with limits: sys.exit, stdout, hangs, non-numbers, non-finite values,
a ratio of a metric that can be negative, NaN inputs, and notes in the text output. Through the CLI in-process on
the fake seams (no Docker): the exit code and the one error line are what a CI job sees."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import gatekit
import modelkit
from fakes import FakeBackend, FakeBuilder
from tiergate import usercode
from tiergate.cli.main import main
from tiergate.errors import InputError

X86 = "x86_64-cpu-onnxruntime"
N = 200

USER = '''
import ctypes
import os
import sys
import time

import numpy as np

def samples():
    rng = np.random.default_rng(0)
    for i in range({n}):
        x = np.eye(4, dtype=np.float32)[i % 4] + rng.random(4).astype(np.float32) * 0.1
        yield {{"x": x[None]}}, i % 4

def exits():
    sys.exit(0)

def exits_later():
    yield from samples()
    sys.exit(0)

class Odd(BaseException):
    pass

def base_exception():
    raise Odd("not an Exception")

def chatty():
    print("hello from the loader")                       # Python's stdout
    os.write(1, b"raw bytes on fd 1\\n")                  # the file descriptor itself
    ctypes.CDLL(None).printf(b"printf from C\\n")         # C stdio, buffered
    yield from samples()

def endless():
    while True:
        yield {{"x": np.zeros((1, 4), np.float32)}}, 0

def big():
    while True:
        yield {{"x": np.zeros((1, 4), np.float32)}}, np.zeros(300_000, np.int64)

def logprob(outputs, labels):                            # mean log-probability of the truth: higher is better, < 0
    p = outputs["probs"][np.arange(len(labels)), labels.astype(np.int64)]
    return float(np.mean(np.log(np.clip(p, 1e-6, 1))))

def accuracy(outputs, labels):
    return float(np.mean(outputs["probs"].argmax(-1) == labels))

def metric_exits(outputs, labels):
    sys.exit(0)

def metric_prints(outputs, labels):
    print("metric says hi")
    os.write(1, b"metric raw\\n")
    return accuracy(outputs, labels)

def as_text(outputs, labels):
    return "0.9"

def as_bool(outputs, labels):
    return True

def as_none(outputs, labels):
    return None

def as_complex(outputs, labels):
    return 0.9 + 0j

def as_pair(outputs, labels):
    return np.array([0.9, 0.8])

def as_numpy(outputs, labels):
    return np.float32(accuracy(outputs, labels))

def as_array1(outputs, labels):
    return np.array([accuracy(outputs, labels)])

def hits_of_zero(outputs, labels):                       # 1 where the top score's index equals the label 0-3
    return float(np.mean(outputs["probs"].argmax(-1) == labels + 1))   # labels -1..2: only a user metric reads them
'''


@pytest.fixture
def case(tmp_path, tiergate_home, monkeypatch):
    """An identity 'classifier' fed scores: the reference right on about 90%, the candidate on about 18%."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, N)
    probs = lambda ok: np.where(ok[:, None], np.eye(4)[labels] * 0.7 + 0.1,  # noqa: E731
                                np.eye(4)[(labels + 1) % 4] * 0.7 + 0.1).astype(np.float32)
    ref, bad = probs(rng.random(N) < 0.9), probs(rng.random(N) < 0.18)
    np.savez(tmp_path / "scores.npz", x=ref, labels=labels)
    user = tmp_path / "user.py"
    user.write_text(USER.format(n=N))
    identity = modelkit.write(modelkit.linear(np.eye(4), output_name="probs"), tmp_path / "identity.onnx")
    scaled = modelkit.write(modelkit.linear(np.eye(4) * 1.0001, output_name="probs"), tmp_path / "scaled.onnx")
    backend = FakeBackend(outputs_for={"candidate": {"probs": bad}})
    gatekit.fake_cli_seams(monkeypatch, FakeBuilder(), backend)
    return {"folder": tmp_path, "user": user, "data": tmp_path / "scores.npz", "ref": identity, "cand": scaled,
            "backend": backend, "home": tiergate_home}


def _gate(capfd, case, *extra, data=None, policy=None):
    args = ["gate", "-c", str(case["cand"]), "-r", str(case["ref"]), "-d", str(data or case["data"]), "-t", X86]
    if policy is not None:
        path = case["folder"] / "policy.toml"
        path.write_text(policy)
        args += ["--policy", str(path)]
    code = main(args + list(extra))
    out, err = capfd.readouterr()
    return code, out, err


def _one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("tiergate: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _nothing_decided(case) -> None:
    assert not (case["home"] / "decisions").exists() or not any((case["home"] / "decisions").iterdir())


# --- 6. sys.exit and other BaseExceptions: one line, exit 2, never PROMOTE's 0 ---------------------------
@pytest.mark.parametrize("function, message", [
    ("exits", "data loader {user}:exits: called sys.exit(0)"),
    ("exits_later", "data loader {user}:exits_later: sample 200: called sys.exit(0)"),
    ("base_exception", "data loader {user}:base_exception: raised Odd: not an Exception"),
])
def test_a_loader_that_exits_is_exit_2_with_one_line(case, capfd, function, message):
    code, out, err = _gate(capfd, case, data=f"{case['user']}:{function}")
    assert code == 2, (code, out, err)
    assert message.format(user=case["user"]) in _one_error(err)
    assert case["backend"].runs == [] and out == ""
    _nothing_decided(case)


def test_a_metric_that_exits_is_exit_2_naming_it_and_nothing_is_recorded(case, capfd):
    code, out, err = _gate(capfd, case, "--metric", f"{case['user']}:metric_exits")
    assert code == 2, (code, out, err)
    assert f"metric metric_exits ({case['user']}:metric_exits): called sys.exit(0)" in _one_error(err)
    _nothing_decided(case)


def test_a_metric_file_that_exits_on_import_is_exit_2(case, capfd):
    exits = case["folder"] / "exits.py"
    exits.write_text("import sys\nsys.exit(0)\ndef m(outputs, labels):\n    return 1.0\n")
    code, out, err = _gate(capfd, case, "--metric", f"{exits}:m")
    assert code == 2 and f"importing {exits}: called sys.exit(0)" in _one_error(err)


# --- stdout of user code goes to stderr: --json stays JSON (Python, fd 1 and C stdio) ----------------------
def test_json_stays_json_when_a_loader_and_a_metric_print(case, capfd):
    code, out, err = _gate(capfd, case, "--json", "--metric", f"{case['user']}:metric_prints",
                           data=f"{case['user']}:chatty")
    assert code in (0, 1, 3), err
    doc = json.loads(out)                        # nothing but the JSON document on stdout
    assert doc["verdict"] in ("PROMOTE", "REJECT", "INCONCLUSIVE")
    for line in ("hello from the loader", "raw bytes on fd 1", "printf from C", "metric says hi", "metric raw"):
        assert line in err and line not in out


# --- hangs: a timeout per call, naming the function ----------------------------------------------------------
def test_a_hung_call_is_a_one_line_error_naming_it_and_the_setting(monkeypatch):
    release = threading.Event()
    monkeypatch.setenv(usercode.TIMEOUT_ENV, "0.2")
    with pytest.raises(InputError, match=r"metric slow \(m.py:slow\): did not return within 0.2 s .*"
                                         "TIERGATE_USER_CODE_TIMEOUT_S"):
        usercode.call("metric slow (m.py:slow)", release.wait)
    release.set()                               # the abandoned call ends; stdout is given back when it does
    for _ in range(100):
        if usercode._redirect_depth == 0:
            break
        threading.Event().wait(0.05)
    assert usercode._redirect_depth == 0


def test_a_hung_loader_sample_names_the_sample(case, monkeypatch):
    release = threading.Event()
    monkeypatch.setenv(usercode.TIMEOUT_ENV, "0.2")

    def loader():
        yield {"x": np.zeros((1, 4), np.float32)}
        release.wait()
        yield {"x": np.zeros((1, 4), np.float32)}
    with pytest.raises(InputError, match=r"data loader l.py:f: sample 1: did not return within 0.2 s"):
        list(usercode.iterate("data loader l.py:f", loader, lambda i: f"data loader l.py:f: sample {i}"))
    release.set()


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_the_timeout_setting_is_checked(monkeypatch, value):
    monkeypatch.setenv(usercode.TIMEOUT_ENV, value)
    with pytest.raises(InputError, match="TIERGATE_USER_CODE_TIMEOUT_S"):
        usercode.timeout_s()


# --- a sample cap on loaders ----------------------------------------------------------------------------------
@pytest.mark.parametrize("function, env, message", [
    ("endless", {"TIERGATE_LOADER_MAX_SAMPLES": "50"}, "yields more than 50 samples, the limit "
                                                       "(TIERGATE_LOADER_MAX_SAMPLES)"),
    ("big", {"TIERGATE_LOADER_MAX_MB": "10"}, "exceed 10 MB, the limit (TIERGATE_LOADER_MAX_MB)"),
])
def test_a_loader_is_capped_in_samples_and_bytes(case, capfd, monkeypatch, function, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, out, err = _gate(capfd, case, data=f"{case['user']}:{function}")
    assert code == 2 and message in _one_error(err)
    assert case["backend"].runs == []


# --- a metric's value: a finite real number --------------------------------------------------------------------
@pytest.mark.parametrize("function", ["as_text", "as_bool", "as_none", "as_complex"])
def test_a_metric_that_returns_no_real_number_is_exit_2(case, capfd, function):
    code, out, err = _gate(capfd, case, "--metric", f"{case['user']}:{function}")
    assert code == 2, (code, err)
    assert f"metric {function} ({case['user']}:{function}): returned" in _one_error(err)
    assert "not a real number" in err


def test_a_metric_that_returns_values_for_other_samples_is_exit_2(case, capfd):
    code, out, err = _gate(capfd, case, "--metric", f"{case['user']}:as_pair")       # 2 values, 200 samples
    assert code == 2, (code, err)
    assert _one_error(err).endswith(f"metric as_pair ({case['user']}:as_pair): its per-sample values must be {N} "
                                    "real numbers, one per sample (got float64[2])")


@pytest.mark.parametrize("value", [np.float32(0.5), np.int64(3), np.array([0.25]), np.array(0.5), 2, 0.5])
def test_numpy_scalars_and_size_1_arrays_are_numbers(value):
    assert usercode.real_number("metric m", value) == float(np.asarray(value).reshape(()))


@pytest.mark.parametrize("value", [True, np.bool_(True), "0.9", None, 1j, np.array([1.0, 2.0]), np.array(["a"]),
                                   float("nan"), np.float64("inf")])
def test_anything_else_is_refused(value):
    with pytest.raises(InputError, match="metric m: returned"):
        usercode.real_number("metric m", value)


# --- 7. a ratio of a metric that can be zero or negative is refused; max_drop judges it -------------------------
def _float_labels(case):
    """The same scores with the labels as floats: no top-1 check, the user metric alone decides."""
    with np.load(case["data"]) as npz:
        x, labels = npz["x"], npz["labels"]
    path = case["folder"] / "float-labels.npz"
    np.savez(path, x=x, labels=labels.astype(np.float64))
    return path


def test_a_ratio_of_a_negative_metric_is_refused_pointing_to_max_drop(case, capfd):
    code, out, err = _gate(capfd, case, "--metric", f"{case['user']}:logprob", data=_float_labels(case),
                           policy="[metrics.logprob]\nmin_ratio = 0.95\n")
    assert code == 2, (code, out, err)          # it was PROMOTE (exit 0): an 18%-accurate candidate, ratio ~ 2
    line = _one_error(err)
    assert "metric logprob" in line and "zero or negative" in line and "[metrics.logprob] max_drop" in line
    _nothing_decided(case)


def test_max_drop_judges_a_negative_metric_as_a_difference(case, capfd):
    code, out, err = _gate(capfd, case, "--json", "--metric", f"{case['user']}:logprob", data=_float_labels(case),
                           policy="[metrics.logprob]\nmax_drop = 0.05\n")
    doc = json.loads(out)
    check = next(c for c in doc["checks"] if c["name"] == "logprob_difference")
    assert code == 1 and not check["passed"] and check["op"] == ">=" and check["threshold"] == -0.05
    assert check["value"] < -0.05
    case["backend"].outputs_for.clear()          # a candidate with the reference's scores: no drop, PROMOTE
    case["cand"] = modelkit.write(modelkit.linear(np.eye(4) * 1.0002, output_name="probs"),
                                  case["folder"] / "same.onnx")
    code, out, err = _gate(capfd, case, "--json", "--metric", f"{case['user']}:logprob", data=_float_labels(case),
                           policy="[metrics.logprob]\nmax_drop = 0.01\n")
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "logprob_difference")
    assert code == 0 and check["passed"] and abs(check["value"]) < 1e-3, err


def test_a_user_metric_at_zero_for_the_candidate_is_a_reject_not_an_error(case, capfd):
    """Issue 41: a non-negative, higher-is-better metric whose candidate value is 0 beside a positive reference is a
    ratio of 0, a REJECT (exit 1); it was refused (exit 2) as if the ratio meant nothing."""
    case["backend"].outputs_for["candidate"]["probs"] = np.full((N, 4), 0.25, np.float32)
    code, out, err = _gate(capfd, case, "--json", "--metric", f"{case['user']}:accuracy", data=_float_labels(case),
                           policy="[metrics.accuracy]\nmin_ratio = 0.9\n")
    doc = json.loads(out)
    check = next(c for c in doc["checks"] if c["name"] == "accuracy_ratio")
    assert code == 1 and doc["verdict"] == "REJECT", err
    assert check["value"] < 0.5 and not check["passed"] and not check["inconclusive"]


def test_negative_labels_are_read_by_a_user_metric_and_by_nothing_else(case, capfd):
    """Issue 41: labels below 0 were refused even where only a user metric reads them; they are no class indices,
    so no top-1 accuracy is computed from them."""
    with np.load(case["data"]) as npz:
        x, labels = npz["x"], npz["labels"]
    shifted = case["folder"] / "shifted.npz"
    np.savez(shifted, x=x, labels=labels - 1)                  # -1..2
    code, out, err = _gate(capfd, case, "--json", "--metric", f"{case['user']}:hits_of_zero", data=shifted,
                           policy="[metrics.hits_of_zero]\nmin_ratio = 0.9\n")
    doc = json.loads(out)
    names = {c["name"] for c in doc["checks"]}
    assert "hits_of_zero_ratio" in names and "accuracy_ratio" not in names, (code, err)
    assert code == 1 and doc["verdict"] == "REJECT"           # the 18%-right candidate, judged by the user metric
    task = next(iter(doc["metrics"].values()))["task"]["hits_of_zero"]
    assert task["reference"] > 0.8 and task["candidate"] < 0.3


def test_a_positive_user_metric_keeps_its_ratio_and_builtins_keep_working(case, capfd):
    code, out, err = _gate(capfd, case, "--json", "--metric", f"{case['user']}:as_numpy", "--metric", "f1",
                           policy="[metrics.as_numpy]\nmin_ratio = 0.9\n")
    doc = json.loads(out)
    names = {c["name"] for c in doc["checks"]}
    assert code == 1 and {"as_numpy_ratio", "accuracy_ratio"} <= names


@pytest.mark.parametrize("table, message", [
    ("[metrics.logprob]\nmax_drop = 0.1\nmin_ratio = 0.9\n", "both max_drop and min_ratio"),
    ("[metrics.top1_accuracy]\nmax_drop = 0.1\n", "use min_ratio"),
    ("[metrics.logprob]\nmax_drop = nan\n", "non-negative number"),
    ("[metrics.logprob]\nmax_drop = -0.1\n", "non-negative number"),
])
def test_max_drop_is_checked_in_the_policy(case, capfd, table, message):
    code, out, err = _gate(capfd, case, "--metric", f"{case['user']}:logprob", policy=table)
    assert code == 2 and message in _one_error(err)


# --- NaN or infinity in the input data: exit 2 naming the input and the first bad sample -------------------------
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_inputs_are_refused_naming_the_input_and_the_sample(case, capfd, bad):
    with np.load(case["data"]) as npz:
        x, labels = npz["x"].copy(), npz["labels"]
    x[37, 2] = bad
    x[150, 0] = np.nan
    path = case["folder"] / "nan.npz"
    np.savez(path, x=x, labels=labels)
    code, out, err = _gate(capfd, case, data=path)
    assert code == 2, (code, out, err)
    assert f"input 'x' holds {bad} at sample 37 (and 1 other sample(s)); inputs must be finite" in _one_error(err)
    assert case["backend"].runs == []


def test_a_non_finite_sample_on_a_later_axis_is_named_by_its_sample(tmp_path):
    from tiergate.artifact.model import TensorSpec
    from tiergate.evaldata import load_eval_data, validate_against

    state = np.zeros((2, 30, 4), np.float32)
    state[1, 12, 3] = np.nan
    np.savez(tmp_path / "d.npz", state=state)
    data = load_eval_data(tmp_path / "d.npz", sample_axes={"state": 1})
    with pytest.raises(InputError, match=r"input 'state' holds nan at sample 12 \(and 0 other"):
        validate_against(data, [TensorSpec("state", (2, "batch", 4), "float32")])


# --- decision notes reach the text output -------------------------------------------------------------------------
def test_notes_are_printed_in_the_text_output(case, capfd):
    with np.load(case["data"]) as npz:
        x = npz["x"]
    path = case["folder"] / "float-labels.npz"
    np.savez(path, x=x, labels=np.linspace(0, 1, N))       # not class indices: no task metric
    code, out, err = _gate(capfd, case, data=path)
    assert "note: " in out and "labels are not one class index per sample" in out, out
