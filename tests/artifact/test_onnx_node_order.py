"""Node order is the runtime's question (issue 45): onnxruntime's own float16 converter (keep_io_types) writes its
input Casts after the nodes that read them; onnxruntime runs that file, so tiergate takes it (its nodes in a
topological order, the file untouched). A graph with no order at all (a cycle) is refused in one whole line that
names the node, never cut before its name."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import modelkit
from tiergate.artifact import load_artifact
from tiergate.cli.main import main
from tiergate.errors import InputError


def test_the_float16_converter_s_output_is_taken_with_its_nodes_in_order(tmp_path, capsys):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    fp32 = modelkit.write(modelkit.mlp(), tmp_path / "fp32.onnx")
    fp16 = convert_float_to_float16(onnx.load(fp32), keep_io_types=True)
    path = tmp_path / "fp16.onnx"
    onnx.save(fp16, path)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(fp16)                      # the checker alone refuses it
    before = path.read_bytes()
    art = load_artifact(path)
    made = {i.name for i in art.inputs} | set(art.initializers)
    for node in art.nodes:                                  # every input made before it is read
        assert all(not name or name in made for name in node.inputs), node
        made.update(node.outputs)
    assert path.read_bytes() == before and art.op_counts["Cast"] == 2
    assert main(["inspect", str(path)]) == 0, capsys.readouterr().err


def test_a_cycle_is_refused_in_one_whole_line_naming_the_node(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"], name="first_add"), helper.make_node("Relu", ["a"], ["b"],
                                                                                        name="then_relu")],
        "cycle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", modelkit.OPSET)])
    model.ir_version = 8
    path = tmp_path / "cycle.onnx"
    onnx.save(model, path)
    with pytest.raises(InputError) as caught:
        load_artifact(path)
    text = caught.value.one_line()
    assert "topologically sorted" in text and "first_add" in text and "\n" not in text
    assert main(["inspect", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "first_add" in line and "Traceback" not in line
