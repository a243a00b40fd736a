"""--describe-at-load (an emulated class's describing run): the candidate's run session describes itself, with the
description and outputs of a run whose describe has a session of its own (harness_after.DescribeBeside), and
without a second session; never under the counting QEMU, whose load instructions are gated."""

from __future__ import annotations

import argparse
import json

import numpy as np

import execution_kit as kit
from tiergate import results
from tiergate.execution import Job, LocalProcessBackend
from tiergate.execution.base import harness_command
from tiergate.execution.run import execute_group

ONNX_CLASS = "x86_64-cpu-onnxruntime"


def _jobs(models, data, out, dc):
    return [Job(dc, data, out / "ref", artifact_path=models["mlp_v2"], role="reference", eval_batch=16,
                latency_calls=4, eval_workers=2),
            Job(dc, data, out / "cand", artifact_path=models["mlp"], role="candidate", eval_batch=16,
                latency_calls=4, eval_workers=2, describe=True)]


def test_a_run_session_that_describes_itself_gives_the_same_description_and_outputs(models, tmp_path):
    data = kit.eval_data(tmp_path / "eval.npz", n=150)
    native = kit.device_class(ONNX_CLASS)
    emulated = kit.device_class(ONNX_CLASS, execution="emulated")   # run here natively: the harness's options only
    assert emulated.emulated and not native.emulated
    described, loads = {}, {}
    for name, dc in (("beside", native), ("at_load", emulated)):
        jobs = _jobs(models, data, tmp_path / name, dc)
        command = harness_command(jobs, ["r.onnx", "c.onnx"], "d.npz", ["o0", "o1"])
        assert ("--describe-at-load" in command) == (name == "at_load")
        ran = execute_group(jobs, LocalProcessBackend())
        assert all(r.ok for r in ran), [r.reason for r in ran]
        assert not (tmp_path / name / "ref" / "describe.json").exists()
        described[name] = json.loads((tmp_path / name / "cand" / "describe.json").read_text())
        loads[name] = ran[1].device.load_ms
    beside, at_load = described["beside"], described["at_load"]
    assert beside["ok"] and at_load["ok"]
    level = beside["default_level"]
    for field in ("default_level", "providers", "machine", "versions", "transformers", "disabled"):
        assert at_load[field] == beside[field], field
    for field in ("nodes", "placement", "file"):
        assert at_load["levels"][level][field] == beside["levels"][level][field], field
    assert (tmp_path / "at_load" / "cand" / at_load["levels"][level]["file"]).stat().st_size > 0
    # its seconds are the run's own load: no second session was made
    assert at_load["levels"][level]["seconds"] == round(loads["at_load"] / 1e3, 3)
    np.testing.assert_array_equal(results.load_outputs(tmp_path / "at_load" / "cand")["y"],
                                  results.load_outputs(tmp_path / "beside" / "cand")["y"])


def test_no_run_session_describes_itself_under_the_counting_qemu_or_another_runtime(monkeypatch):
    from fakes import harness

    h = harness()
    args = argparse.Namespace(describe_at_load=True, runtime="onnxruntime")
    assert h.describes_at_load(args, True)
    assert not h.describes_at_load(args, False)                            # not a described artifact
    assert not h.describes_at_load(argparse.Namespace(describe_at_load=False, runtime="onnxruntime"), True)
    assert not h.describes_at_load(argparse.Namespace(describe_at_load=True, runtime="tflite"), True)
    monkeypatch.setenv(h.INSN_ENV, "/tmp/counts")
    assert not h.describes_at_load(args, True)
