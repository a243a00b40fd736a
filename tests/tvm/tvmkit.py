"""A tiny ONNX model for the TVM classes' tests (tests/tvm): its Reshape target is computed from its input's
symbolic batch, which the compile step folds once the shapes are static."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def tiny_net(seed: int = 0, *, celu: bool = False) -> onnx.ModelProto:
    """x[N,3,8,8] -> Conv -> Relu (or Celu, which TVM's ONNX frontend does not import) -> Reshape to [N, -1] (the
    target computed from Shape(x): Shape, Gather, Concat) -> MatMul -> Add -> Softmax -> probs[N,3]."""
    rng = np.random.default_rng(seed)

    def init(name, array):
        return numpy_helper.from_array(np.asarray(array, np.float32), name)

    inits = [init("w1", rng.standard_normal((4, 3, 3, 3)) * 0.3), init("b1", rng.standard_normal(4) * 0.1),
             init("wf", rng.standard_normal((4 * 8 * 8, 3)) * 0.1), init("bf", rng.standard_normal(3) * 0.1),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Celu" if celu else "Relu", ["c1"], ["r1"]),
             helper.make_node("Shape", ["r1"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "minus1"], ["flat_shape"], axis=0),
             helper.make_node("Reshape", ["r1", "flat_shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "wf"], ["logits0"]),
             helper.make_node("Add", ["logits0", "bf"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
    graph = helper.make_graph(nodes, "tiny_tvm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
