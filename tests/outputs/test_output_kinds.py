"""What each output is (tiergate.outputs): the common layouts found from shapes, metadata and the graph, each
with its reason; a policy's [outputs.NAME] overrides or adds, checked with one-line errors; inspect shows them."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import taskkit
from tiergate.artifact import load_artifact
from tiergate.artifact.model import Artifact, Node, TensorSpec
from tiergate.cli.main import main
from tiergate.errors import InputError
from tiergate.outputs import resolve
from tiergate.policy import load_policy


def _artifact(inputs, outputs, nodes=(), metadata=None) -> Artifact:
    return Artifact(path=__import__("pathlib").Path("m.onnx"), format="onnx", sha256="0", size_bytes=0, version="",
                    inputs=[TensorSpec(*i) for i in inputs], outputs=[TensorSpec(*o) for o in outputs],
                    nodes=[Node(i, op, f"n{i}", list(ins), list(outs)) for i, (op, ins, outs) in enumerate(nodes)],
                    metadata=metadata or {})


IMAGE = ("x", (None, 3, 224, 224), "float32")


def _ctc_model(path, alphabet: str | None, vocab: int = 7):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 4])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", "T", vocab])
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(4, vocab)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"]),
                               helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)], "ctc", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    if alphabet is not None:
        helper.set_model_props(model, {"character": alphabet})
    onnx.save(model, str(path))
    return path


def test_a_yolo_head_is_a_detector_with_its_classes_from_the_metadata(tmp_path):
    path = tmp_path / "yolo.onnx"
    onnx.save(taskkit.yolo_like(), str(path))
    kind = resolve(load_artifact(path))["output0"]
    assert (kind.kind, kind.layout, kind.channels_first, kind.box_format) == ("detection", "yolo", True, "cxcywh")
    assert "3 class names in the metadata" in kind.why


def test_a_ctc_output_takes_pp_ocr_s_alphabet_from_the_metadata(tmp_path):
    kind = resolve(load_artifact(_ctc_model(tmp_path / "rec.onnx", "a\nb\nc\nd\ne")))["probs"]
    assert (kind.kind, kind.alphabet_size, kind.alphabet_source) == ("ctc", 7, "metadata:character")
    assert kind.alphabet[0] == "" and kind.alphabet[1:6] == ("a", "b", "c", "d", "e") and kind.alphabet[6] == " "
    bare = resolve(load_artifact(_ctc_model(tmp_path / "bare.onnx", None)))["probs"]
    assert bare.kind == "ctc" and not bare.alphabet and "symbol indices" in bare.why


@pytest.mark.parametrize("outputs, nodes, expected", [
    ([("regressors", (1, 896, 16), "float32"), ("classificators", (1, 896, 1), "float32")], (),
     {"regressors": ("detection", "ssd"), "classificators": ("detection", "ssd_scores")}),
    ([("mask", (None, 1, 224, 224), "float32")], (), {"mask": ("map", "probability")}),
    ([("seg", (None, 21, 224, 224), "float32")], (), {"seg": ("map", "classes")}),
    ([("heat", (None, 21, 56, 56), "float32")], (), {"heat": ("values", "")}),
    ([("Identity", (1, 63), "float32")], (), {"Identity": ("landmarks", "")}),
    ([("probs", (None, 63), "float32")], [("Softmax", ["x"], ["probs"])], {"probs": ("class_scores", "")}),
    ([("emb", (None, 128), "float32")], [("LpNormalization", ["x"], ["emb"])], {"emb": ("embedding", "")}),
    ([("emb", (None, 128), "float32")], [("ReduceL2", ["v"], ["n"]), ("Div", ["v", "n"], ["emb"])],
     {"emb": ("embedding", "")}),
    ([("dets", (None, 300, 6), "float32")], [("NonMaxSuppression", ["b", "s"], ["sel"])], {"dets": ("detection", "nms")}),
    ([("logits", (None, 1000), "float32")], (), {"logits": ("class_scores", "")}),
    ([("state", (2, None, 128), "float32")], (), {"state": ("values", "")}),
])
def test_common_layouts_are_found_from_shapes_and_the_graph(outputs, nodes, expected):
    found = resolve(_artifact([IMAGE], outputs, nodes))
    assert {name: (k.kind, k.layout) for name, k in found.items()} == expected
    assert all(k.why and k.source == "detected" for k in found.values())


def test_landmarks_count_points_and_values():
    kind = resolve(_artifact([("input_1", (1, 256, 256, 3), "float32")], [("pose", (1, 195), "float32")]))["pose"]
    assert (kind.kind, kind.points, kind.dims, kind.input_size) == ("landmarks", 39, 5, (256, 256))


def test_the_policy_overrides_and_adds_kinds(tmp_path):
    art = _artifact([IMAGE], [("out", (None, 84, 8400), "float32"), ("aux", (None, 10), "float32")])
    policy = tmp_path / "p.toml"
    policy.write_text('[outputs.out]\nkind = "detection"\nlayout = "yolo_objectness"\nscore_threshold = 0.4\n'
                      '[outputs.aux]\nkind = "values"\n')
    found = resolve(art, load_policy(policy).outputs)
    assert (found["out"].layout, found["out"].score_threshold, found["out"].source) == ("yolo_objectness", 0.4,
                                                                                       "policy")
    assert found["aux"].kind == "values"


@pytest.mark.parametrize("table, message", [
    ('[outputs.out]\nkind = "boxes"\n', "kind must be one of class_scores, detection"),
    ('[outputs.out]\nkind = "detection"\nlayout = "retina"\n', "layout must be one of yolo"),
    ('[outputs.out]\nscore_threshold = 2\n', "score_threshold must be a number from 0 to 1"),
    ('[outputs.out]\ncolour = "red"\n', "unknown key 'colour'"),
    ('[outputs.out]\nblank = -1\n', "blank must be a whole number >= 0"),
    ("outputs = 3\n", "'outputs' must be tables"),
])
def test_a_bad_outputs_table_is_one_line_naming_it(tmp_path, table, message):
    policy = tmp_path / "p.toml"
    policy.write_text(table)
    with pytest.raises(InputError, match=message):
        load_policy(policy)


def test_a_table_naming_no_output_or_an_unreadable_alphabet_is_refused(tmp_path):
    art = _artifact([IMAGE], [("out", (None, 84, 8400), "float32")])
    with pytest.raises(InputError, match=r"\[outputs.typo\] names no output of m.onnx \(outputs: out\)"):
        resolve(art, {"typo": {"kind": "values"}})
    with pytest.raises(InputError, match="layout \"ssd\" needs scores"):
        resolve(art, {"out": {"kind": "detection", "layout": "ssd"}})
    rec = _artifact([("x", (None, 3, 48, 320), "float32")], [("probs", (None, None, 7), "float32")])
    with pytest.raises(InputError, match="the model has no metadata 'vocab'"):
        resolve(rec, {"probs": {"kind": "ctc", "alphabet": "metadata:vocab"}})
    symbols = tmp_path / "symbols.txt"
    symbols.write_text("a\nb\n")
    with pytest.raises(InputError, match="2 symbols do not fit the output's 7"):
        resolve(rec, {"probs": {"kind": "ctc", "alphabet": str(symbols)}})
    symbols.write_text("a\nb\nc\nd\ne\nf\n")
    assert resolve(rec, {"probs": {"kind": "ctc", "alphabet": str(symbols)}})["probs"].alphabet[1:] == tuple("abcdef")


def test_inspect_shows_each_output_s_kind_and_the_policy_s(tmp_path, capsys):
    path = tmp_path / "yolo.onnx"
    onnx.save(taskkit.yolo_like(), str(path))
    code = main(["inspect", str(path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["outputs"]["output0"]["kind"] == "detection" and "alphabet" not in doc["outputs"]["output0"]
    policy = tmp_path / "p.toml"
    policy.write_text('[outputs.output0]\nkind = "values"\n')
    code = main(["inspect", str(path), "--policy", str(policy), "--json"])
    kind = json.loads(capsys.readouterr().out)["outputs"]["output0"]
    assert code == 0 and (kind["kind"], kind["source"]) == ("values", "policy")
