"""Outputs never overwrite inputs, and an unusable home is one line: every command that writes a path the user
names refuses, before any work starts, a path that is an input (by name, through a symbolic link, as a hard link)
or lies inside TIERGATE_HOME; a home that is a file, under /proc or unwritable is exit 2 with one line.

No Docker: every refusal comes before anything is built or run (the sample-axis case runs on the fake seams).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

import gatekit
import modelkit
from fakes import FakeBackend, FakeBuilder
from tiergate.cli.main import main

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture
def case(tmp_path):
    """A tiny classifier and its INT8 twin, their data, a calibration set, a policy and a metric file, each with its sha256."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(64, 8)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=x, labels=(x @ w).argmax(1).astype(np.int64))
    np.savez(tmp_path / "cal.npz", x=x[:16])
    files = {"ref": modelkit.write(modelkit.linear(w, softmax=True), tmp_path / "ref.onnx"),
             "cand": tmp_path / "cand.onnx",
             "data": tmp_path / "eval.npz", "cal": tmp_path / "cal.npz", "policy": tmp_path / "policy.toml",
             "metric": tmp_path / "metric.py"}
    modelkit.quantize_qdq(files["ref"], files["cand"], {"x": x[:32]})       # an INT8 candidate, as explain wants
    files["policy"].write_text("[defaults]\nmin_accuracy_ratio = 0.5\n")
    files["metric"].write_text("def score(outputs, labels):\n    return 1.0\n")
    return files


def _hashes(files: dict) -> dict:
    return {k: hashlib.sha256(Path(p).read_bytes()).hexdigest() for k, p in files.items() if Path(p).is_file()}


def _one_line_error(capsys, code: int, *words: str) -> str:
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("tiergate: error: "), err
    assert "Traceback" not in err + out and "internal error" not in err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _gate(c, *extra) -> list[str]:
    return ["gate", "-c", str(c["cand"]), "-r", str(c["ref"]), "-d", str(c["data"]), "-t", X86,
            "--policy", str(c["policy"]), *extra]


# --- outputs never overwrite inputs -------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["ref", "cand", "data", "policy", "metric"])
def test_gate_junit_onto_an_input_is_refused_before_work(case, tiergate_home, capsys, target):
    before = _hashes(case)
    code = main(_gate(case, "--metric", f"{case['metric']}:score", "--junit", str(case[target])))
    _one_line_error(capsys, code, "--junit", "overwrite an input")
    assert _hashes(case) == before and not (tiergate_home / "runs").exists()


def test_a_symbolic_or_hard_link_to_an_input_is_the_input(case, tiergate_home, capsys, tmp_path):
    (tmp_path / "link.xml").symlink_to(case["data"])
    os.link(case["ref"], tmp_path / "hard.xml")
    before = _hashes(case)
    for name, what in (("link.xml", "evaluation data"), ("hard.xml", "reference")):
        code = main(_gate(case, "--junit", str(tmp_path / name)))
        _one_line_error(capsys, code, what)
    assert _hashes(case) == before


def test_an_onnx_external_data_file_is_an_input(tmp_path, tiergate_home, capsys, case):
    model = modelkit.write(modelkit.linear(np.ones((8, 4))), tmp_path / "ext" / "big.onnx", external="big.bin")
    weights = model.parent / "big.bin"
    before = weights.read_bytes()
    (tmp_path / "elsewhere").mkdir()
    os.link(weights, tmp_path / "elsewhere" / "junit.xml")          # a hard link of it, in another folder
    for target in (weights, tmp_path / "elsewhere" / "junit.xml"):
        code = main(["gate", "-c", str(model), "-r", str(case["ref"]), "-d", str(case["data"]), "-t", X86,
                     "--junit", str(target)])
        _one_line_error(capsys, code, "candidate's file")
    assert weights.read_bytes() == before


def test_reports_inside_the_home_are_refused(case, tiergate_home, capsys):
    tiergate_home.mkdir(parents=True, exist_ok=True)
    code = main(_gate(case, "--report-dir", str(tiergate_home / "reports")))
    _one_line_error(capsys, code, "--report-dir", "inside tiergate's home")
    code = main(["report", "--model", "m", "--out", str(tiergate_home / "runs")])
    _one_line_error(capsys, code, "--out", "inside tiergate's home")


@pytest.mark.parametrize("target", ["ref", "cand", "data", "cal"])
def test_explain_mixed_precision_onto_an_input_is_refused_before_work(case, tiergate_home, capsys, target):
    before = _hashes(case)
    code = main(["explain", "-c", str(case["cand"]), "-r", str(case["ref"]), "-d", str(case["data"]), "-t", X86,
                 "--calibration-data", str(case["cal"]), "--mixed-precision", str(case[target])])
    _one_line_error(capsys, code, "--mixed-precision", "overwrite an input")
    assert _hashes(case) == before and not (tiergate_home / "explain").exists()


@pytest.mark.parametrize("where", ["folder", "proc", "under_a_file"])
def test_explain_mixed_precision_into_an_unusable_place(case, tiergate_home, capsys, tmp_path, where):
    (tmp_path / "afile").write_text("x")
    out = {"folder": tmp_path, "proc": Path("/proc/tiergate-mixed.onnx"),
           "under_a_file": tmp_path / "afile" / "mixed.onnx"}[where]
    code = main(["explain", "-c", str(case["cand"]), "-r", str(case["ref"]), "-d", str(case["data"]), "-t", X86,
                 "--calibration-data", str(case["cal"]), "--mixed-precision", str(out)])
    _one_line_error(capsys, code, "--mixed-precision")
    assert not (tiergate_home / "explain").exists()


def test_explain_out_onto_its_own_mixed_model_is_refused(case, tiergate_home, capsys, tmp_path):
    code = main(["explain", "-c", str(case["cand"]), "-r", str(case["ref"]), "-d", str(case["data"]), "-t", X86,
                 "--calibration-data", str(case["cal"]), "--out", str(tmp_path / "rep"),
                 "--mixed-precision", str(tmp_path / "rep" / "explain.json")])
    _one_line_error(capsys, code, "also where")


@pytest.mark.tflite_extra
def test_explain_mixed_precision_on_tflite_says_it_needs_onnx(tmp_path, tiergate_home, capsys):
    pair = modelkit.tflite_mlp_pair(tmp_path)
    np.savez(tmp_path / "eval.npz", x=np.zeros((4, 8), np.float32))
    code = main(["explain", "-c", str(pair["int8"]), "-r", str(pair["fp32"]), "-d", str(tmp_path / "eval.npz"),
                 "-t", "x86_64-cpu-tflite", "--calibration-data", str(tmp_path / "eval.npz"),
                 "--mixed-precision", str(tmp_path / "mixed.tflite")])
    _one_line_error(capsys, code, "--mixed-precision", "tflite", "needs ONNX")
    assert not (tiergate_home / "explain").exists()


@pytest.mark.parametrize("target", ["ref", "cand", "data", "cal"])
def test_explain_fix_onto_an_input_is_refused_before_work(case, tiergate_home, capsys, tmp_path, target):
    """--fix OUT_DIR writes files named by method: one of them a link to an input is refused, nothing written."""
    out = tmp_path / "fixes"
    out.mkdir()
    (out / "recal-entropy.onnx").symlink_to(case[target])
    before = _hashes(case)
    code = main(["explain", "-c", str(case["cand"]), "-r", str(case["ref"]), "-d", str(case["data"]), "-t", X86,
                 "--calibration-data", str(case["cal"]), "--fix", str(out)])
    _one_line_error(capsys, code, "--fix", "recal-entropy.onnx", "overwrite an input")
    assert _hashes(case) == before and [p.name for p in out.iterdir()] == ["recal-entropy.onnx"]


def test_explain_fix_into_the_home_or_onto_a_file_is_refused(case, tiergate_home, capsys):
    tiergate_home.mkdir(parents=True, exist_ok=True)
    for where, words in ((tiergate_home / "fixes", ("--fix", "inside tiergate's home")),
                         (case["policy"], ("--fix", "is a file"))):
        code = main(["explain", "-c", str(case["cand"]), "-r", str(case["ref"]), "-d", str(case["data"]), "-t", X86,
                     "--calibration-data", str(case["cal"]), "--fix", str(where)])
        _one_line_error(capsys, code, *words)


@pytest.mark.tflite_extra
def test_explain_fix_on_tflite_says_it_needs_onnx(tmp_path, tiergate_home, capsys):
    pair = modelkit.tflite_mlp_pair(tmp_path)
    np.savez(tmp_path / "eval.npz", x=np.zeros((4, 8), np.float32))
    code = main(["explain", "-c", str(pair["int8"]), "-r", str(pair["fp32"]), "-d", str(tmp_path / "eval.npz"),
                 "-t", "x86_64-cpu-tflite", "--calibration-data", str(tmp_path / "eval.npz"),
                 "--fix", str(tmp_path / "fixes")])
    _one_line_error(capsys, code, "--fix", "tflite", "needs ONNX")
    assert not (tmp_path / "fixes").exists() and not (tiergate_home / "explain").exists()


# --- an unusable home ---------------------------------------------------------------------------------------


def _homes(tmp_path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "home-file").write_text("not a folder")
    return {"a file": (tmp_path / "home-file", "is a file"),
            "under /proc": (Path("/proc/tiergate-home"), "under /proc"),
            "under a file": (tmp_path / "home-file" / "sub", "cannot write there")}


@pytest.mark.parametrize("kind", ["a file", "under /proc", "under a file"])
@pytest.mark.parametrize("command", ["gate", "gc", "register", "explain", "report"])
def test_an_unusable_home_is_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys, kind, command):
    home, words = _homes(tmp_path)[kind]
    monkeypatch.setenv("TIERGATE_HOME", str(home))
    monkeypatch.delenv("TIERGATE_REGISTRY_URL", raising=False)
    monkeypatch.delenv("TIERGATE_STORE", raising=False)
    args = {"gate": _gate(case),
            "gc": ["gc", "--dry-run"],
            "register": ["register", str(case["cand"]), "--model", "m", "--reference", str(case["ref"])],
            "explain": ["explain", "-c", str(case["cand"]), "-r", str(case["ref"]), "-d", str(case["data"]),
                        "-t", X86],
            "report": ["report", "--model", "m", "--out", str(tmp_path / "rep")]}[command]
    _one_line_error(capsys, main(args), "TIERGATE_HOME", words)


def test_an_os_error_outside_the_home_check_is_exit_2_not_1(monkeypatch, capsys, tiergate_home):
    """Any operating-system error that reaches the CLI is the machine's problem: exit 2 and one line, never
    exit 1 (REJECT's code) with a traceback."""
    from tiergate.cli import main as cli_main

    def broken(args):
        raise NotADirectoryError(20, "Not a directory", "/somewhere/runtime-graphs")

    monkeypatch.setattr(cli_main, "_run", broken)
    _one_line_error(capsys, cli_main.main(["gate"]), "/somewhere/runtime-graphs", "Not a directory")


# --- sample axes ----------------------------------------------------------------------------------------------


def test_a_sample_axis_of_no_input_or_output_is_refused(case, tiergate_home, monkeypatch, capsys):
    backend = FakeBackend()
    gatekit.fake_cli_seams(monkeypatch, FakeBuilder(), backend)
    code = main(_gate(case, "--sample-axis", "bogus=1"))
    _one_line_error(capsys, code, "--sample-axis bogus=1", "known: x")
    assert backend.runs == []


def test_a_gate_to_be_recorded_refuses_an_unregistered_candidate_before_any_run(case, tiergate_home, tmp_path,
                                                                                 monkeypatch, capsys):
    """`gate --registry` records its decision against the registered candidate: one not registered is refused
    after intake, before anything is built or run (not after every run, when the decision cannot be written);
    registered, the same gate runs and is recorded."""
    from tiergate.registry import Registry

    backend, builder = FakeBackend(), FakeBuilder()
    gatekit.fake_cli_seams(monkeypatch, builder, backend)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    code = main(_gate(case, "--registry", url))
    _one_line_error(capsys, code, "cand.onnx", "is not in the registry", "tiergate register")
    assert backend.runs == [] and builder.calls == []
    assert main(["register", str(case["cand"]), "--model", "tiny", "--reference", str(case["ref"]),
                 "--registry", url]) == 0
    capsys.readouterr()
    assert main(_gate(case, "--registry", url)) in (0, 1)
    assert backend.runs and builder.calls
    registry = Registry(url)
    try:
        assert len(registry.decisions(artifact_sha=hashlib.sha256(case["cand"].read_bytes()).hexdigest())) == 1
    finally:
        registry.close()


def test_serve_takes_its_own_default_drift_folder_named_but_no_other_place_in_the_home(case, tiergate_home):
    """`serve --drift-out $TIERGATE_HOME/drift` names serve's own default: allowed; any other folder inside the
    home is tiergate's state and is refused before the server starts."""
    from tiergate.cli.serve import _settings
    from tiergate.errors import InputError

    settings = _settings(case["data"], None, None, None, None, None, [], tiergate_home / "drift", None, None)
    assert Path(settings.drift_out) == (tiergate_home / "drift").resolve()
    with pytest.raises(InputError, match="inside tiergate's home"):
        _settings(case["data"], None, None, None, None, None, [], tiergate_home / "runs", None, None)
