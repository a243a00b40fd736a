"""explain through If nodes (explain/specialize.py): an If whose condition the evaluation data fix is replaced by the
branch they take, nested Ifs too, so the branch's tensors are paired like any others; an If whose condition varies
between samples stays, its tensors skipped with the reason. A tiny generated model, as silero VAD is built: the
network inside `If(Equal(mode, 1))`, a nested `If(Greater(mode, 0))` inside its then_branch, the branches reading a
top-level activation and a top-level weight from the outer scope."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelkit
from tiergate.execution.explain import HostRunner, explain
from tiergate.explain.specialize import specialize
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"
C = 4


def _w(rng, name, scale=0.4):
    return numpy_helper.from_array((rng.standard_normal((C, C, 3, 3)) * scale).astype(np.float32), name)


def branchy(seed: int = 0, broken: str = "") -> onnx.ModelProto:
    """x [N,4,6,6], mode int64 scalar -> pre = Relu(x) -> If(mode == 1:
         then: conv_a(pre, w_a) -> relu_a -> If(mode > 0: then conv_b(relu_a, w_shared) -> relu_b; else Identity)
         else: conv_c(pre, w_c) -> relu_c) -> out -> conv_d -> y.
    `broken`: that weight's values scaled by 3 (a candidate whose branch computes something else there)."""
    rng = np.random.default_rng(seed)
    node = helper.make_node
    w_a, w_c, w_d, shared = _w(rng, "w_a"), _w(rng, "w_c"), _w(rng, "w_d"), _w(rng, "w_shared")
    for w in (w_a, w_c, w_d, shared):
        if w.name == broken:
            w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 3, w.name))
    act = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)  # noqa: E731
    inner_then = helper.make_graph([node("Conv", ["relu_a", "w_shared"], ["conv_b"], name="conv_b", pads=[1] * 4),
                                    node("Relu", ["conv_b"], ["relu_b"], name="relu_b")], "inner_then", [],
                                   [act("relu_b")])
    inner_else = helper.make_graph([node("Identity", ["relu_a"], ["same_a"], name="same_a")], "inner_else", [],
                                   [act("same_a")])
    then = helper.make_graph(
        [node("Conv", ["pre", "w_a"], ["conv_a"], name="conv_a", pads=[1] * 4),
         node("Relu", ["conv_a"], ["relu_a"], name="relu_a"),
         node("Greater", ["mode", "zero"], ["positive"], name="positive"),
         node("If", ["positive"], ["inner_out"], name="inner_if", then_branch=inner_then, else_branch=inner_else)],
        "then", [], [act("inner_out")], [w_a])
    other = helper.make_graph([node("Conv", ["pre", "w_c"], ["conv_c"], name="conv_c", pads=[1] * 4),
                               node("Relu", ["conv_c"], ["relu_c"], name="relu_c")], "else", [], [act("relu_c")], [w_c])
    graph = helper.make_graph(
        [node("Relu", ["x"], ["pre"], name="pre"), node("Equal", ["mode", "one"], ["is_one"], name="is_one"),
         node("If", ["is_one"], ["out"], name="top_if", then_branch=then, else_branch=other),
         node("Conv", ["out", "w_d"], ["y"], name="conv_d", pads=[1] * 4)],
        "branchy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", C, 6, 6]),
                    helper.make_tensor_value_info("mode", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", C, 6, 6])],
        [w_d, shared, numpy_helper.from_array(np.array(1, np.int64), "one"),
         numpy_helper.from_array(np.array(0, np.int64), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", modelkit.OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _feeds(modes, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, C, 6, 6)).astype(np.float32), "mode": np.array(m, np.int64)} for m in modes]


def _outputs(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run(None, f)[0] for f in feeds]


@pytest.mark.parametrize("mode", [1, 2])
def test_the_branch_the_data_take_is_inlined(mode):
    model, feeds = branchy(), _feeds([mode] * 5)
    done = specialize(model, feeds)
    texts = [b.text() for b in done.branches]
    if mode == 1:      # then_branch, then the nested If (now at the top level) on mode > 0, read from two levels out
        assert texts == ["top_if: then_branch (mode == 1 in every sample)",
                         "inner_if: then_branch (mode > 0 in every sample)"]
        inside = ["conv_a", "relu_a", "conv_b"]
    else:
        assert texts == ["top_if: else_branch (mode == 1 is false in every sample)"]
        inside = ["conv_c"]
    graph = done.model.graph
    assert not any(n.op_type == "If" for n in graph.node) and done.skipped == {} and done.refused == ""
    computed = [o for n in graph.node for o in n.output]
    assert all(name in computed for name in inside)
    # a branch's output is renamed to its If's output (relu_b -> inner_out -> out, relu_c -> out)
    assert next(n.op_type for n in graph.node if "out" in n.output) == "Relu" and "relu_b" not in computed
    inits = {t.name for t in graph.initializer}
    assert ("w_a" if mode == 1 else "w_c") in inits and "is_one" not in computed     # the condition: pruned
    onnx.checker.check_model(done.model)
    # the same numerics, to float rounding (onnxruntime fuses the inlined Conv and Relu, which it does not across
    # an If's boundary: 1.4e-6 at most measured)
    for a, b in zip(_outputs(model, feeds), _outputs(done.model, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert done.max_abs_diff < 1e-5
    assert model.graph.node[2].op_type == "If"                                  # the original is left as it was


def test_an_if_whose_condition_varies_between_samples_stays():
    model = branchy()
    done = specialize(model, _feeds([1, 2, 1]))
    assert done.branches == [] and done.model is model
    assert done.skipped["conv_a"] == "inside top_if (If): its condition depends on mode, whose values differ between samples"
    assert {"conv_b", "relu_c"} <= set(done.skipped)


def test_a_specialization_that_changes_the_outputs_is_refused(monkeypatch):
    from tiergate.explain import specialize as module

    monkeypatch.setattr(module, "max_difference", lambda a, b, feeds: (0.5, 1.0))
    done = module.specialize(branchy(), _feeds([1] * 3))
    assert done.branches == [] and "changed the model's outputs" in done.refused
    assert "changed the model's outputs" in done.skipped["conv_a"]


def test_explain_pairs_the_tensors_inside_the_taken_branch(tiergate_home, tmp_path):
    ref = modelkit.write(branchy(), tmp_path / "ref.onnx")
    cand = modelkit.write(branchy(broken="w_shared"), tmp_path / "cand.onnx")    # the nested branch's conv_b differs
    feeds = _feeds([1] * 6)
    np.savez(tmp_path / "d.npz", x=np.concatenate([f["x"] for f in feeds]), mode=np.array(1, np.int64))  # mode: 0-d
    item = explain(cand, ref, tmp_path / "d.npz", resolve(X86), runner=HostRunner()).targets[X86]
    names = [layer.tensor for layer in item.layers]
    assert names.index("conv_a") < names.index("relu_a") < names.index("conv_b") < names.index("y")
    assert item.first_divergent == "conv_b", [(x.tensor, round(x.sqnr_db, 1)) for x in item.layers]
    assert all(x.sqnr_db == 200.0 for x in item.layers[:names.index("conv_b")])   # before it: identical
    assert [(b["node"], b["branch"], b["models"]) for b in item.branches] == [
        ("top_if", "then_branch", ["candidate", "reference"]), ("inner_if", "then_branch", ["candidate", "reference"])]
    assert item.skipped == []


def test_names_two_inlined_branches_share_are_told_apart():
    """Two Ifs whose branches each compute a `t` (legal: each branch is its own scope): inlined, one is renamed,
    and what reads it follows."""
    node, value = helper.make_node, helper.make_tensor_value_info

    def branch(tag, op):
        return helper.make_graph([node("Relu", ["x"], ["t"], name=f"relu_{tag}"), node(op, ["t"], [f"u_{tag}"])],
                                 tag, [], [value(f"u_{tag}", TensorProto.FLOAT, None)])

    graph = helper.make_graph(
        [node("Equal", ["mode", "one"], ["cond"]),
         node("If", ["cond"], ["a"], name="if_a", then_branch=branch("a", "Neg"), else_branch=branch("a2", "Abs")),
         node("If", ["cond"], ["b"], name="if_b", then_branch=branch("b", "Sigmoid"), else_branch=branch("b2", "Abs")),
         node("Add", ["a", "b"], ["y"])],
        "twins", [value("x", TensorProto.FLOAT, ["N", 3]), value("mode", TensorProto.INT64, [])],
        [value("y", TensorProto.FLOAT, ["N", 3])], [numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", modelkit.OPSET)])
    model.ir_version = 8
    feeds = [{"x": np.random.default_rng(s).standard_normal((1, 3)).astype(np.float32), "mode": np.array(1)}
             for s in range(3)]
    done = specialize(model, feeds)
    assert [b.node for b in done.branches] == ["if_a", "if_b"] and done.refused == ""
    outputs = {o for n in done.model.graph.node for o in n.output}
    reads = {n.op_type: list(n.input) for n in done.model.graph.node}
    assert {"t", "t__inlined"} <= outputs and {reads["Neg"][0], reads["Sigmoid"][0]} == {"t", "t__inlined"}
    onnx.checker.check_model(done.model)
    for a, b in zip(_outputs(model, feeds), _outputs(done.model, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-6)
