"""Fast tests of the Prefect wiring that need no server: retry classification, revalidation inputs, CLI errors."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

import modelkit as mk
from tiergate.cli.main import main
from tiergate.errors import InfrastructureFault, InputError
from tiergate.orchestration.revalidation import artifact_sha, device_classes_for, prepare, previous_artifact
from tiergate.orchestration.tasks import infrastructure_only
from tiergate.registry import Registry, register_artifact
from tiergate.registry.store import file_sha256


def _failed_with(exc: BaseException):
    from prefect.states import Failed

    return Failed(data=exc, message=str(exc))


def test_only_infrastructure_faults_are_retried():
    from prefect.states import Completed

    assert infrastructure_only(None, None, _failed_with(InfrastructureFault("engine gone"))) is True
    assert infrastructure_only(None, None, _failed_with(InputError("bad model"))) is False
    assert infrastructure_only(None, None, _failed_with(RuntimeError("a bug"))) is False
    assert infrastructure_only(None, None, Completed(data=1)) is False


def test_engine_problem_names_an_engine_that_does_not_answer(tmp_path):
    from dataclasses import replace

    from tiergate.targets import resolve

    from tiergate.execution.run import backend_for

    dc = replace(resolve(["x86_64-cpu-onnxruntime"])[0], docker_host=f"unix://{tmp_path}/none.sock")
    problem = backend_for(dc).engine_problem()
    assert problem is not None and f"unix://{tmp_path}/none.sock" in problem and "does not answer" in problem


@pytest.mark.docker
def test_engine_problem_is_none_for_the_running_engine():
    from tiergate.execution.run import backend_for
    from tiergate.targets import resolve

    assert backend_for(resolve(["x86_64-cpu-onnxruntime"])[0]).engine_problem() is None


def test_artifact_sha_takes_the_event_resource_id():
    sha = "ab" * 32
    assert artifact_sha(f"tiergate.artifact.{sha}") == sha
    assert artifact_sha(f"  {sha[:12]} ") == sha[:12]


def test_device_classes_follow_the_artifact_format():
    both = "x86_64-cpu-onnxruntime,x86_64-cpu-tflite"
    assert [dc.name for dc in device_classes_for("onnx", both)] == ["x86_64-cpu-onnxruntime"]
    assert [dc.name for dc in device_classes_for("tflite", both)] == ["x86_64-cpu-tflite"]
    assert all(not dc.gpu and dc.artifact_format == "onnx" for dc in device_classes_for("onnx", None))
    with pytest.raises(InputError, match="runs tflite"):
        device_classes_for("tflite", "x86_64-cpu-onnxruntime")


def _linear(path, scale: float):
    return mk.write(mk.linear(np.arange(12, dtype=np.float32).reshape(4, 3) * scale, name="lin"), path)


def test_prepare_finds_reference_previous_artifact_and_incumbent(tmp_path):
    ref, v1, v2 = (_linear(tmp_path / f"{n}.onnx", s) for n, s in (("ref", 1.0), ("v1", 1.01), ("v2", 0.99)))
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with Registry(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "store") as registry:
        first = register_artifact(registry, v1, model="lin", reference=ref, at=t0).artifact
        second = register_artifact(registry, v2, model="lin", reference=ref, at=t0 + timedelta(days=1)).artifact
        assert previous_artifact(registry, first) is None
        assert previous_artifact(registry, second).sha256 == first.sha256
        registry.record_decision(first.sha256, "promote", tiers=["x86-server"])
        job = prepare(registry, f"tiergate.artifact.{second.sha256}", "x86_64-cpu-onnxruntime", tmp_path / "work")
    assert job.shas == {"candidate": file_sha256(v2), "reference": file_sha256(ref), "incumbent": file_sha256(v1)}
    assert {role: file_sha256(path) for role, path in job.paths.items()} == job.shas   # copied from the store
    assert job.previous[1] == first.sha256 and file_sha256(job.previous[0]) == first.sha256


def test_serve_without_a_prefect_api_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.zeros((2, 4), np.float32))
    assert main(["serve", "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Prefect API" in err[0]


@pytest.mark.parametrize("args, message", [
    (["--remote", "x86_64-cpu-onnxruntime"], "expected DEVICE_CLASS=WORK_POOL"),
    (["--remote", "nope=pool"], "unknown device class 'nope'"),
    (["--targets", "x86_64-cpu-tflite", "--remote", "x86_64-cpu-onnxruntime=pool"], "not among --targets"),
])
def test_serve_rejects_bad_options_in_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")   # never reached: input is checked first
    data = tmp_path / "eval.npz"
    np.savez(data, x=np.zeros((2, 4), np.float32))
    assert main(["serve", "--data", str(data), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_serve_rejects_missing_data(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert main(["serve", "--data", str(tmp_path / "missing.npz")]) == 2
    assert "evaluation data does not exist" in capsys.readouterr().err


def test_cd_example_uses_real_gate_options_and_publishes_what_the_gate_writes(capsys):
    """docs/ci/github-actions.yml: every option of its gate command exists, and the publish steps
    read the files the gate writes (JUnit at --junit, the Markdown summary in --report-dir)."""
    import re
    import shlex
    from pathlib import Path

    import yaml

    from tiergate.reports.markdown import SUMMARY_FILE

    workflow = yaml.safe_load((Path(__file__).parents[2] / "docs" / "ci" / "github-actions.yml").read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    command = next(s["run"] for s in steps if "tiergate gate" in s.get("run", ""))
    args = shlex.split(command.replace("\\\n", " "))
    options = {a for a in args if a.startswith("--")}
    assert main(["gate", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert options and all(re.search(rf"{re.escape(o)}\b", help_text) for o in options), options
    junit = args[args.index("--junit") + 1]
    report_dir = args[args.index("--report-dir") + 1]
    published = " ".join(str(s.get("with", "")) + s.get("run", "") for s in steps if s.get("if") == "always()")
    assert junit in published and f"{report_dir}/{SUMMARY_FILE}" in published
