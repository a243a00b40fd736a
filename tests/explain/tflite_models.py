"""The TFLite explain tests' models, made by TensorFlow's own converter from one tf.function (TensorFlow is
imported only here, through tests/modelkit.py):

  image [N,8,8,1] -> conv1 (3x3, 8 ch, relu) -> conv2 (3x3, 16 ch, relu) -> 2x2 max pool -> + a constant
  -> flatten -> fc1 (256x32, relu) -> fc2 (32x10) -> softmax

conv2's output, the middle of the network (MIDDLE below), reaches about 15 on the evaluation data: beyond
the default [-6, 6] range. Every model is converted with serialize_debug_metadata=True, so the file keeps
where each op came from (this file, the line of the op in `_function`).

- fp32: the reference; int8: full integer (int8 kernels, int8 input and output), calibrated;
- dynamic: dynamic range (float activations, int8 weights: conv2 and fc1 have over 1024 weights);
- island: int8 with conv2 kept in float by the converter's own selective quantization (QuantizationDebugger,
  denylisted_nodes): DEQUANTIZE -> CONV_2D (float) -> QUANTIZE, the two tensors the converter inserts.

Defects, edited in the flatbuffer: `with_range` (an activation's quantization set to a range, e.g. the
default [-6, 6] of an uncalibrated tensor), `with_weight_scale` (a layer's int8 weights read with a wrong
scale), and `renamed` (every tensor but the inputs renamed t<index>: pairing cannot lean on names).
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import numpy as np

import modelkit

SHAPE = (8, 8, 1)
INPUT = "image"
KINDS = ("fp32", "int8", "dynamic", "island")


def _weights(seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape, gain):
        return (rng.standard_normal(shape) * gain).astype(np.float32)

    return {"k1": w(3, 3, 1, 8, gain=0.6), "b1": w(8, gain=0.1), "k2": w(3, 3, 8, 16, gain=0.45),
            "b2": w(16, gain=0.1), "shift": w(4, 4, 16, gain=0.5), "w1": w(256, 32, gain=0.15),
            "c1": w(32, gain=0.1), "w2": w(32, 10, gain=0.1)}


def _function(tf):
    const = {k: tf.constant(v) for k, v in _weights().items()}

    @tf.function(input_signature=[tf.TensorSpec([None, *SHAPE], tf.float32, name=INPUT)])
    def net(image):
        h = tf.nn.relu(tf.nn.conv2d(image, const["k1"], 1, "SAME") + const["b1"])
        h = tf.nn.relu(tf.nn.conv2d(h, const["k2"], 1, "SAME") + const["b2"])       # MIDDLE
        h = tf.nn.max_pool2d(h, 2, 2, "VALID") + const["shift"]
        h = tf.nn.relu(tf.matmul(tf.reshape(h, [-1, 256]), const["w1"]) + const["c1"])
        return tf.nn.softmax(tf.matmul(h, const["w2"]))

    return net


MIDDLE_LINE = next(i for i, line in enumerate(inspect.getsource(_function).splitlines())
                   if line.rstrip().endswith("# MIDDLE")) + inspect.getsourcelines(_function)[1]


def images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype(np.float32)


def _representative():
    data = images(48, seed=11)
    return lambda: ([data[i:i + 1]] for i in range(len(data)))


@functools.cache
def tflite(kind: str) -> bytes:
    """One of KINDS, converted once per test process."""
    tf = modelkit._tf()
    net = _function(tf)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([net.get_concrete_function()], net)
    converter.serialize_debug_metadata = kind != "island"     # (the debugger's quantizer misreads the names)
    if kind == "fp32":
        return converter.convert()
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if kind == "dynamic":
        return converter.convert()
    converter.representative_dataset = _representative()
    if kind == "int8":
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        return converter.convert()
    if kind == "island":
        middle = middle_name(tflite("fp32"))
        options = tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=[middle])
        debugger = tf.lite.experimental.QuantizationDebugger(converter=converter, debug_dataset=_representative(),
                                                             debug_options=options)
        return bytes(debugger.get_nondebug_quantized_model())
    raise ValueError(kind)


def middle_name(data: bytes) -> str:
    """The name of conv2's output (the second CONV_2D's) in a converted model."""
    model = modelkit._unpack(data)
    graph = model.subgraphs[0]
    convs = [op for op in graph.operators if _opname(model, op) == "CONV_2D"]
    return graph.tensors[convs[1].outputs[0]].name.decode()


def _opname(model, op) -> str:
    schema = modelkit._schema()
    code = model.operatorCodes[op.opcodeIndex]
    builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
    return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}[builtin]


def _tensor(graph, name: str):
    found = [t for t in graph.tensors if t.name.decode() == name]
    assert len(found) == 1, (name, len(found))
    return found[0]


def with_range(data: bytes, tensor: str, lo: float = -6.0, hi: float = 6.0) -> bytes:
    """The int8 activation `tensor` given the range [lo, hi] instead of its calibrated one, and so are the
    tensors that must share its range (a MAX_POOL_2D's or RESHAPE's output: the converter gives them their
    input's, and LiteRT refuses a max pool whose output range differs from its input's)."""
    model = modelkit._unpack(data)
    graph = model.subgraphs[0]
    scale = (hi - lo) / 255.0
    todo = [graph.tensors.index(_tensor(graph, tensor))]
    while todo:
        index = todo.pop()
        q = graph.tensors[index].quantization
        assert q is not None and q.scale is not None and len(q.scale) == 1
        old = (list(q.scale), list(q.zeroPoint))
        q.scale, q.zeroPoint = [scale], [int(round(-128 - lo / scale))]
        q.min, q.max = None, None
        for op in graph.operators:
            if op.inputs is not None and len(op.inputs) and op.inputs[0] == index and \
                    _opname(model, op) in ("MAX_POOL_2D", "RESHAPE"):
                out = graph.tensors[op.outputs[0]].quantization
                if out is not None and (list(out.scale), list(out.zeroPoint)) == old:
                    todo.append(op.outputs[0])
    return modelkit._pack(model)


def with_weight_scale(data: bytes, op_output: str, factor: float) -> bytes:
    """The int8 weights of the op that writes `op_output` read with their scales times `factor`."""
    model = modelkit._unpack(data)
    graph = model.subgraphs[0]
    index = graph.tensors.index(_tensor(graph, op_output))
    op = next(o for o in graph.operators if index in o.outputs)
    weights = graph.tensors[op.inputs[1]]
    assert weights.type == 9 and weights.quantization.scale is not None       # int8
    weights.quantization.scale = [s * factor for s in weights.quantization.scale]
    return modelkit._pack(model)


def renamed(data: bytes) -> bytes:
    """Every tensor but the model's inputs renamed t<index>."""
    model = modelkit._unpack(data)
    graph = model.subgraphs[0]
    for i, tensor in enumerate(graph.tensors):
        if i not in graph.inputs:
            tensor.name = f"t{i}".encode()
    return modelkit._pack(model)


def write(folder: Path, name: str, data: bytes) -> Path:
    path = Path(folder) / name
    path.write_bytes(data)
    return path


def quantize_output(data: bytes, tensor: str) -> str:
    """The name of the tensor the QUANTIZE reading `tensor` writes (the re-quantization after a float op)."""
    model = modelkit._unpack(data)
    graph = model.subgraphs[0]
    index = graph.tensors.index(_tensor(graph, tensor))
    op = next(o for o in graph.operators if _opname(model, o) == "QUANTIZE" and list(o.inputs) == [index])
    return graph.tensors[op.outputs[0]].name.decode()


def unfused(data: bytes, op_output: str) -> bytes:
    """The op writing `op_output` without its fused activation, followed by that activation as its own op
    (which writes `op_output`; the op's own output is a new tensor, `op_output` + "/pre")."""
    schema = modelkit._schema()
    model = modelkit._unpack(data)
    graph = model.subgraphs[0]
    index = graph.tensors.index(_tensor(graph, op_output))
    k, op = next((k, o) for k, o in enumerate(graph.operators) if index in o.outputs)
    names = {v: k for k, v in vars(schema.ActivationFunctionType).items() if not k.startswith("_")}
    activation = names[op.builtinOptions.fusedActivationFunction]
    op.builtinOptions.fusedActivationFunction = schema.ActivationFunctionType.NONE
    pre = modelkit._new_tensor(model, index, op_output + "/pre")
    op.outputs = [pre]
    code = modelkit._opcode(model, getattr(schema.BuiltinOperator, activation))
    graph.operators.insert(k + 1, modelkit._operator(model, code, [pre], [index]))
    return modelkit._pack(model)


def per_channel(data: bytes, tensor: str) -> bytes:
    """The int8 activation `tensor` given one scale per channel (last axis): what the converter never writes."""
    model = modelkit._unpack(data)
    t = _tensor(model.subgraphs[0], tensor)
    channels = t.shape[-1]
    t.quantization.scale = [t.quantization.scale[0]] * channels
    t.quantization.zeroPoint = [t.quantization.zeroPoint[0]] * channels
    t.quantization.quantizedDimension = len(t.shape) - 1
    return modelkit._pack(model)
