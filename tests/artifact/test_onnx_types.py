"""Every ONNX type the loader may meet: sequences, optionals, maps, sparse tensors, untyped and partially
typed values, every element type, at any depth of subgraph. Loading, fingerprint, diff and lint all take
them (models generated here with onnx.helper and checked by the ONNX checker on load)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from tiergate.artifact import load_artifact
from tiergate.artifact.onnx_types import dtype_name, type_text
from tiergate.diff import diff_artifacts
from tiergate.fingerprint import fingerprint
from tiergate.lint import lint

OPSET = 21


def _save(tmp_path, graph, name, opset=OPSET, ir=10):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _all_paths(path):
    artifact = load_artifact(path)
    fp = fingerprint(artifact)
    assert len(fp.combined) >= 12
    assert diff_artifacts(artifact, load_artifact(path)).identical
    lint(artifact)
    return artifact


def test_type_text_names_every_kind():
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    opt = helper.make_optional_type_proto(seq)
    mp = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    sparse = helper.make_sparse_tensor_type_proto(TensorProto.FLOAT, [3, 3])
    assert type_text(seq) == "seq(float32)"
    assert type_text(opt) == "optional(seq(float32))"
    assert type_text(mp) == "map(int64,float32)"
    assert type_text(sparse) == "sparse(float32)"
    assert type_text(onnx.TypeProto()) == "?"
    assert type_text(helper.make_tensor_type_proto(0, None)) == "undefined"
    assert type_text(helper.make_sequence_type_proto(onnx.TypeProto())) == "seq(?)"


@pytest.mark.parametrize("elem", [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                                  TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ, TensorProto.INT4,
                                  TensorProto.UINT4, TensorProto.FLOAT4E2M1, TensorProto.STRING,
                                  TensorProto.COMPLEX64])
def test_every_element_type_loads_as_a_named_input(tmp_path, elem):
    x = helper.make_tensor_value_info("x", elem, [2, "n"])
    y = helper.make_tensor_value_info("y", elem, [2, "n"])
    path = _save(tmp_path, helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]), "e")
    artifact = _all_paths(path)
    assert artifact.inputs[0].dtype == dtype_name(elem) and artifact.inputs[0].shape == (2, "n")
    assert "type" not in dtype_name(elem) and dtype_name(elem) != "undefined"


def test_unknown_and_unset_element_types_never_raise():
    assert dtype_name(0) == "undefined"
    assert dtype_name(999) == "type999"


def test_sequence_and_optional_graph_inputs(tmp_path):
    seq_t = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, ["n"]))
    opt_t = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    inputs = [helper.make_value_info("s", seq_t), helper.make_value_info("o", opt_t)]
    nodes = [helper.make_node("SequenceLength", ["s"], ["len"]),
             helper.make_node("OptionalHasElement", ["o"], ["has"])]
    outputs = [helper.make_tensor_value_info("len", TensorProto.INT64, []),
               helper.make_tensor_value_info("has", TensorProto.BOOL, [])]
    artifact = _all_paths(_save(tmp_path, helper.make_graph(nodes, "g", inputs, outputs), "seq"))
    assert [(t.name, t.dtype, t.shape) for t in artifact.inputs] == [("s", "seq(float32)", ()),
                                                                      ("o", "optional(float32)", ())]


def test_untyped_loop_body_inside_an_if_branch(tmp_path):
    """A Loop body whose inputs declare no type (as onnx's own expanded tests write them), two levels deep."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["acc", "one"], ["acc_out"])],
        "body", [helper.ValueInfoProto(name="i"), helper.ValueInfoProto(name="cond_in"),
                 helper.ValueInfoProto(name="acc")],
        [helper.ValueInfoProto(name="cond_out"), helper.ValueInfoProto(name="acc_out")],
        initializer=[helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    loop = helper.make_node("Loop", ["trip", "", "x"], ["y_then"], body=body)
    then_g = helper.make_graph([loop], "then", [], [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, [1])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["y_else"])], "else", [],
                               [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, [1])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
         helper.make_tensor_value_info("trip", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = _save(tmp_path, graph, "loop")
    artifact = _all_paths(path)
    assert any(n.path.startswith("If_0/then_branch/Loop_0/body/") for n in artifact.nodes)
    # a different constant in the innermost body moves the weights hash only
    other = onnx.load(str(path))
    then_branch = next(a.g for a in other.graph.node[0].attribute if a.name == "then_branch")
    inner = then_branch.node[0].attribute[0].g.initializer[0]
    inner.CopyFrom(helper.make_tensor("one", TensorProto.FLOAT, [1], [2.0]))
    onnx.save(other, str(tmp_path / "loop2.onnx"))
    a, b = fingerprint(artifact), fingerprint(load_artifact(tmp_path / "loop2.onnx"))
    assert a.structure == b.structure and a.weights != b.weights


def test_sparse_initializer_and_attributes_of_every_kind(tmp_path):
    sparse = helper.make_sparse_tensor(helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0]),
                                       helper.make_tensor("w_idx", TensorProto.INT64, [2], [0, 3]), [2, 2])
    nodes = [helper.make_node("Constant", [], ["c"], sparse_value=sparse),
             helper.make_node("Add", ["x", "c"], ["s"]),
             helper.make_node("Optional", [], ["none"], type=helper.make_tensor_type_proto(TensorProto.FLOAT, [2])),
             helper.make_node("OptionalHasElement", ["none"], ["has"]),
             helper.make_node("Constant", [], ["strs"], value_strings=["a", "b"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 2]),
                               helper.make_tensor_value_info("has", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("strs", TensorProto.STRING, [2])])
    graph.sparse_initializer.append(helper.make_sparse_tensor(
        helper.make_tensor("sp", TensorProto.FLOAT, [1], [5.0]),
        helper.make_tensor("sp_idx", TensorProto.INT64, [1], [1]), [2]))
    artifact = _all_paths(_save(tmp_path, graph, "sparse"))
    assert [t.name for t in artifact.inputs] == ["x"]
    optional = next(n for n in artifact.nodes if n.op == "Optional")
    assert optional.attributes["type"] == {"type": "float32", "dims": [2]}
    constant = artifact.nodes[0]
    assert constant.attributes["sparse_value"] == {"sparse": "float32", "dims": [2, 2]}


def test_string_constants_hash_by_value_not_by_address(tmp_path):
    def model(values, name):
        const = helper.make_tensor("k", TensorProto.STRING, [len(values)], values)
        node = helper.make_node("Identity", ["k"], ["y"])
        graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.STRING, [None])],
                                  initializer=[const])
        return _save(tmp_path, graph, name)
    a, b, c = model([b"x", b"y"], "a"), model([b"x", b"y"], "b"), model([b"x", b"z"], "c")
    assert fingerprint(load_artifact(a)).weights == fingerprint(load_artifact(b)).weights
    assert fingerprint(load_artifact(a)).weights != fingerprint(load_artifact(c)).weights
