"""File-level intake asks the host's onnxruntime to create a session (no inference): a model it refuses never
passes with `ok: true`, and the reason is named (IR version, opset) in the runtime's own words. Models are
generated here; onnxruntime is the real one."""

from __future__ import annotations

import dataclasses

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tiergate.artifact import load_artifact
from tiergate.lint import lint
from tiergate.lint.ort_coverage import runtime_words
from tiergate.targets import resolve

# the newest IR version the installed onnx writes (14 with onnx 1.23) is beyond onnxruntime 1.31's (13)
IR_NEWEST = onnx.IR_VERSION


def _relu(tmp_path, name, *, ir=10, opset=21):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _random_uniform_like(tmp_path):
    """RandomUniformLike at opset 22: the kernel registry lists an open-ended range, the session still fails."""
    node = helper.make_node("RandomUniformLike", ["x"], ["y"], dtype=TensorProto.FLOAT)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    path = tmp_path / "rul.onnx"
    onnx.save(model, str(path))
    return path


def _refuses(path) -> bool:
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001
        return True
    return False


def _errors(path, dc=None):
    return [f for f in lint(load_artifact(path), dc) if f.severity == "error"]


def test_a_loadable_model_has_no_error(tmp_path):
    path = _relu(tmp_path, "ok.onnx")
    assert not _refuses(path) and _errors(path) == []


@pytest.mark.parametrize(("ir", "opset", "named"), [(IR_NEWEST, 21, "IR version"), (10, 27, "opset 27")],
                         ids=["ir", "opset"])
def test_a_version_beyond_the_runtime_is_named(tmp_path, ir, opset, named):
    path = _relu(tmp_path, f"v{ir}_{opset}.onnx", ir=ir, opset=opset)
    assert _refuses(path)
    (error,) = _errors(path)
    assert error.rule == "unsupported-op" and error.nodes == () and named in error.message
    assert f"onnxruntime {ort.__version__}" in error.message and "newer than" in error.message
    assert "/onnxruntime_src/" not in error.message          # the runtime's words, not its source locations


def test_a_kernel_listed_but_refused_at_session_creation_is_an_error(tmp_path):
    path = _random_uniform_like(tmp_path)
    assert _refuses(path)
    (error,) = _errors(path)
    assert "RandomUniformLike" in error.message and "refuses" in error.message


def test_a_class_on_another_version_says_which_runtime_answered(tmp_path):
    path = _relu(tmp_path, "v.onnx", ir=10, opset=27)
    dc = dataclasses.replace(resolve("x86_64-cpu-onnxruntime")[0], runtime_version="1.20.0")
    (error,) = _errors(path, dc)
    assert f"the host's onnxruntime {ort.__version__}" in error.message and "runs 1.20.0" in error.message


def test_runtime_words_drop_source_locations_and_signatures():
    raw = ("[ONNXRuntimeError] : 1 : FAIL : Load model from /x/m.onnx failed:/onnxruntime_src/onnxruntime/core/"
           "graph/model.cc:256 onnxruntime::Model::Model(onnx::ModelProto&&, const onnxruntime::PathString&) "
           "Unsupported model IR version: 14, max supported IR version: 13")
    assert runtime_words(raw) == ("[ONNXRuntimeError] : 1 : FAIL : Unsupported model IR version: 14, "
                                  "max supported IR version: 13")



def test_the_tiers_own_refusal_names_the_version_too(tmp_path):
    """--target: the tier's runtime (here the describer run by the host's onnxruntime, as in its container)
    refuses an opset beyond it; the finding names it, on the runtime basis, without source locations."""
    from .test_runtime_graph import host_runtime_graph

    path = _relu(tmp_path, "v27.onnx", ir=10, opset=27)
    graph, done = host_runtime_graph(path, tmp_path / "d")
    assert done.returncode == 1 and not graph.ok
    (error,) = [f for f in lint(load_artifact(path), resolve("x86_64-cpu-onnxruntime")[0], runtime=graph)
                if f.severity == "error"]
    assert error.basis == "runtime" and "opset 27 of domain ai.onnx is newer than onnxruntime" in error.message
    assert f"onnxruntime {ort.__version__} supports (up to opset " in error.message
    assert "/onnxruntime_src/" not in error.message
