"""explain's suggestions (tiergate.explain, the pure part): keep in float only what the candidate quantized,
and rank a clipped input beside divergence."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tiergate.explain import Layer, keep_float, quantized_nodes, worst_layers


def _qdq(name, tensor, out):
    return [helper.make_node("QuantizeLinear", [tensor, "s", "z"], [f"{name}_q"], name=f"{name}_Q"),
            helper.make_node("DequantizeLinear", [f"{name}_q", "s", "z"], [out], name=f"{name}_DQ")]


def _layernorm_after_conv() -> onnx.GraphProto:
    """x -DQ-> Conv_0 (DQ weight) -> c -Q/DQ-> Sub (reads the DQ'd c, its output never quantized) -> Mul_1 -> y.
    Conv_0 runs on integers; Sub and Mul_1 compute in float."""
    w = numpy_helper.from_array(np.ones((2, 1, 1, 1), np.int8), "w_q")
    nodes = (_qdq("x", "x", "x_dq")
             + [helper.make_node("DequantizeLinear", ["w_q", "s", "z8"], ["w_dq"], name="w_DQ"),
                helper.make_node("Conv", ["x_dq", "w_dq"], ["c"], name="Conv_0")]
             + _qdq("c", "c", "c_dq")
             + [helper.make_node("Sub", ["c_dq", "c_dq"], ["d"], name="Sub"),
                helper.make_node("Mul", ["d", "d"], ["y"], name="Mul_1")])
    inits = [w, numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.uint8), "z"), numpy_helper.from_array(np.array(0, np.int8), "z8")]
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])], inits)


def test_only_nodes_on_integers_are_quantized():
    assert quantized_nodes(_layernorm_after_conv()) == {"Conv_0"}


def _layer(tensor, sqnr, saturation=None, nodes=()):
    return Layer(tensor, "op", sqnr, 0.9, 0.1, saturation, nodes=list(nodes))


def test_a_clipped_input_is_ranked_with_divergence_and_float_nodes_are_never_suggested():
    layers = [_layer("x", 31.0, saturation=0.34, nodes=["Conv_0"]),          # SQNR fine, a third clipped
              _layer("c", 24.0, saturation=0.0, nodes=["Conv_0"]),
              _layer("d", 12.0, nodes=[]),                                   # LayerNorm's Sub: not quantized
              _layer("e", 8.0, nodes=[]),
              _layer("y", 7.5, nodes=[])]
    ranked = worst_layers(layers, 20.0, {"y"})
    assert [x.tensor for x in ranked] == ["x", "d", "e"]                    # 34 "dB" of clipping, 12, 4
    assert keep_float(layers, 20.0, {"y"}) == ["Conv_0"]
    # without the clipping, nothing the candidate quantized is a suspect: no suggestion at all
    calm = [_layer("x", 31.0, 0.0, ["Conv_0"])] + layers[1:]
    assert [x.tensor for x in worst_layers(calm, 20.0, {"y"})] == ["d", "e"] and keep_float(calm, 20.0, {"y"}) == []


def test_a_little_clipping_is_not_a_suspect():
    layers = [_layer("x", 40.0, saturation=0.01, nodes=["Conv_0"]), _layer("y", 39.0)]
    assert worst_layers(layers, 20.0, {"y"}) == [] and keep_float(layers, 20.0, {"y"}) == []
