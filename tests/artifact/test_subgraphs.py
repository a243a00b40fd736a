"""If/Loop/Scan bodies are part of the artifact: loaded, fingerprinted, diffed and linted,
with the nesting in each node's path (silero VAD keeps its whole network in If branches)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

import modelkit as m
from tiergate.artifact import load_artifact
from tiergate.diff import diff_artifacts
from tiergate.fingerprint import fingerprint
from tiergate.lint import lint


def _load(model, tmp_path, name):
    return load_artifact(m.save(model, name, tmp_path))


def test_branch_nodes_are_loaded_with_their_path(tmp_path):
    art = _load(m.if_net(), tmp_path, "if.onnx")
    paths = [n.path for n in art.nodes]
    # each body follows the node holding it, in the node's attribute order (make_node sorts them)
    assert paths == ["branch", "branch/else_branch/conv_else", "branch/else_branch/act_else",
                     "branch/then_branch/conv_then", "branch/then_branch/act_then"]
    assert art.op_counts == {"If": 1, "Conv": 2, "LeakyRelu": 1, "Relu": 1}
    conv = next(n for n in art.nodes if n.path.endswith("conv_then"))
    # the body's weight is known under its scoped name, the outer input keeps its own
    assert conv.inputs == ["x", "branch/then_branch/w_then"]
    assert art.initializers["branch/then_branch/w_then"] == ((4, 3, 3, 3), "float32")
    assert art.tensor_dtypes["branch/then_branch/c_then"] == "float32"
    # the model is a real one: onnxruntime runs both branches
    sess = ort.InferenceSession(str(art.path), providers=["CPUExecutionProvider"])
    x = np.ones((1, 3, 8, 8), np.float32)
    assert sess.run(None, {"x": x, "flag": np.array(True)})[0].shape == (1, 4, 8, 8)


def test_fingerprint_sees_inside_branches(tmp_path):
    base = fingerprint(_load(m.if_net(), tmp_path, "a.onnx"))
    assert fingerprint(_load(m.if_net(names="zz_"), tmp_path, "renamed.onnx")) == base
    weights = fingerprint(_load(m.if_net(seed=1), tmp_path, "w.onnx"))
    assert (weights.structure, weights.quantization) == (base.structure, base.quantization)
    assert weights.weights != base.weights
    alpha = fingerprint(_load(m.if_net(alpha=0.3), tmp_path, "alpha.onnx"))
    assert alpha.structure != base.structure and alpha.weights == base.weights


def test_diff_names_the_changed_node_inside_the_branch(tmp_path):
    d = diff_artifacts(_load(m.if_net(), tmp_path, "a.onnx"), _load(m.if_net(alpha=0.3), tmp_path, "b.onnx"))
    assert [(c.name, [(x.what, x.key) for x in c.changes]) for c in d.changed] == [
        ("branch/then_branch/act_then", [("attribute", "alpha")])]
    d = diff_artifacts(_load(m.if_net(), tmp_path, "a.onnx"), _load(m.if_net(identity=True), tmp_path, "c.onnx"))
    assert [(n.op, n.name) for n in d.added] == [("Identity", "branch/then_branch/pass_inserted")]
    assert d.op_counts == {"Identity": (0, 1)}
    renamed = diff_artifacts(_load(m.if_net(), tmp_path, "a.onnx"), _load(m.if_net(names="zz_"), tmp_path, "r.onnx"))
    assert renamed.identical and not renamed.changed


def test_lint_descends_into_branches(tmp_path):
    flagged = [f for f in lint(_load(m.if_net(identity=True), tmp_path, "f.onnx")) if f.rule == "unfused-activation"]
    assert [f.node_names for f in flagged] == [
        ("branch/then_branch/conv_then", "branch/then_branch/pass_inserted", "branch/then_branch/act_then")]
    assert not [f for f in lint(_load(m.if_net(), tmp_path, "c.onnx")) if f.rule == "unfused-activation"]
