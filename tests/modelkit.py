"""The one factory of tiny test models: every test folder builds its ONNX and TFLite models here.

ONNX models are made with onnx.helper (checked with onnx.checker) and quantized with
onnxruntime.quantization; TFLite models are converted with TensorFlow (the tflite extra:
builders that need it skip with the reason when it is absent) and edited with the LiteRT
flatbuffer schema. Builders return an onnx.ModelProto; `write` puts one at a path and
`save` puts one in a session cache folder.

Named builders: mlp, linear, classifier, conv_net, unary_net, memory_hungry, multi_input,
if_subgraph; quantize_qdq / quantize_dynamic_int8; tflite_bytes, tflite_mlp_pair and the
TFLite editors (tflite_softmax_in_float: an NPU's fallback). The lint models come in pairs: each flagged model has a clean twin that
differs only in the defect.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
DEFAULT_RANGE_SCALE = 12.0 / 255.0  # (-6, 6) over uint8/int8: what an uncalibrated tensor gets


@functools.cache
def cache_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="tiergate-test-models-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- ONNX, float

def conv_net(*, identity: bool = False, batchnorm: bool = False, seed: int = 0, alpha: float = 0.1,
             channels: int = 4, noop_clip: bool = False, clip_bound: float | None = None) -> onnx.ModelProto:
    """x[1,3,8,8] -> Conv -> [Clip over float32's whole range, or +-clip_bound] -> [BatchNormalization] ->
    [Identity] -> LeakyRelu -> Conv -> Relu -> Conv -> y. The Clip changes nothing; onnxruntime fuses it into the
    Conv, so a BatchNormalization after it is no longer folded."""
    rng = _rng(seed)
    c = channels
    inits = [
        _init("w1", rng.standard_normal((c, 3, 3, 3)).astype(np.float32) * 0.3),
        _init("b1", rng.standard_normal(c).astype(np.float32) * 0.1),
        _init("w2", rng.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.3),
        _init("b2", rng.standard_normal(c).astype(np.float32) * 0.1),
        _init("w3", rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.3),
        _init("b3", rng.standard_normal(c).astype(np.float32) * 0.1),
    ]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1])]
    last = "c1"
    if noop_clip:
        big = float(np.finfo(np.float32).max) if clip_bound is None else clip_bound
        inits += [_init("clip_lo", np.array(-big, np.float32)), _init("clip_hi", np.array(big, np.float32))]
        nodes.append(helper.make_node("Clip", [last, "clip_lo", "clip_hi"], ["clipped"], name="noop_clip"))
        last = "clipped"
    if batchnorm:
        inits += [_init("bn_s", np.full(c, 1.5, np.float32)), _init("bn_b", np.full(c, 0.2, np.float32)),
                  _init("bn_m", np.full(c, 0.1, np.float32)), _init("bn_v", np.full(c, 2.0, np.float32))]
        nodes.append(helper.make_node("BatchNormalization", [last, "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"],
                                      name="bn1"))
        last = "bn"
    if identity:
        nodes.append(helper.make_node("Identity", [last], ["ident"], name="pass_inserted"))
        last = "ident"
    nodes += [
        helper.make_node("LeakyRelu", [last], ["a1"], name="act1", alpha=alpha),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["a2"], name="act2"),
        helper.make_node("Conv", ["a2", "w3", "b3"], ["y"], name="conv3"),
    ]
    graph = helper.make_graph(
        nodes, "conv_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])],
        inits,
    )
    return _finish(graph)


def if_net(*, identity: bool = False, alpha: float = 0.1, seed: int = 0, names: str = "") -> onnx.ModelProto:
    """x[1,3,8,8], flag(bool) -> If(then: Conv -> [Identity] -> LeakyRelu; else: Conv -> Relu) -> y.

    The network sits inside the If branches, as in silero VAD. `names` prefixes every node
    and value name (a renamed twin)."""
    rng = _rng(seed)
    p = names

    def conv(tag: str, w_seed: float) -> tuple[onnx.NodeProto, TensorProto]:
        w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * w_seed).astype(np.float32), f"{p}w_{tag}")
        return helper.make_node("Conv", ["x", w.name], [f"{p}c_{tag}"], name=f"{p}conv_{tag}", pads=[1, 1, 1, 1]), w

    conv_then, w_then = conv("then", 0.3)
    last = f"{p}c_then"
    then_nodes = [conv_then]
    if identity:
        then_nodes.append(helper.make_node("Identity", [last], [f"{p}ident"], name=f"{p}pass_inserted"))
        last = f"{p}ident"
    then_nodes.append(helper.make_node("LeakyRelu", [last], [f"{p}y_then"], name=f"{p}act_then", alpha=alpha))
    out_spec = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8, 8])  # noqa: E731
    then_g = helper.make_graph(then_nodes, f"{p}then", [], [out_spec(f"{p}y_then")], [w_then])
    conv_else, w_else = conv("else", 0.2)
    else_g = helper.make_graph([conv_else, helper.make_node("Relu", [f"{p}c_else"], [f"{p}y_else"], name=f"{p}act_else")],
                               f"{p}else", [], [out_spec(f"{p}y_else")], [w_else])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], name=f"{p}branch", then_branch=then_g, else_branch=else_g)],
        "if_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [out_spec("y")],
    )
    return _finish(graph)


def unary_net(op: str, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """x -> op -> y with one element type: Sin on float32 runs on the CPU EP, on float16 it does not."""
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], name=f"{op.lower()}0")], "unary",
        [helper.make_tensor_value_info("x", dtype, [2, 2])],
        [helper.make_tensor_value_info("y", dtype, [] if op == "Det" else [2, 2])],
    )
    return _finish(graph)


def _finish(graph: onnx.GraphProto, ir_version: int = 8) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    return model


def write(model: onnx.ModelProto, path: Path, *, external: str | None = None) -> Path:
    """Save at `path` (folders made); with `external`, every initializer goes to that file beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        (path.parent / external).parent.mkdir(parents=True, exist_ok=True)
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=external, size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path


def save(model: onnx.ModelProto, name: str, folder: Path | None = None) -> Path:
    """Write into `folder`, by default a folder kept for the test session."""
    return write(model, (folder or cache_dir()) / name)


def _value(name: str, dtype: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def mlp(*, batch: int | str = "N", seed: int = 0, features: int = 8, outputs: int = 4) -> onnx.ModelProto:
    """y = relu(x @ W + B): input x [batch, features] float32, output y [batch, outputs]."""
    rng = _rng(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])],
        "mlp", [_value("x", TensorProto.FLOAT, [batch, features])], [_value("y", TensorProto.FLOAT, [batch, outputs])],
        [_init("W", rng.standard_normal((features, outputs)).astype(np.float32)),
         _init("B", rng.standard_normal(outputs).astype(np.float32))])
    return _finish(graph, ir_version=9)


def linear(weights: np.ndarray, bias: np.ndarray | None = None, *, softmax: bool = False, input_name: str = "x",
           output_name: str = "y", name: str = "linear") -> onnx.ModelProto:
    """y = [softmax](x @ W [+ b]) with the given weights: x [N, W.shape[0]] float32, y [N, W.shape[1]]."""
    weights = np.asarray(weights, dtype=np.float32)
    inits, last = [_init("W", weights)], "xw" if (bias is not None or softmax) else output_name
    nodes = [helper.make_node("MatMul", [input_name, "W"], [last])]
    if bias is not None:
        inits.append(_init("b", np.asarray(bias, dtype=np.float32)))
        nodes.append(helper.make_node("Add", [last, "b"], ["logits" if softmax else output_name]))
        last = "logits"
    if softmax:
        nodes.append(helper.make_node("Softmax", [last], [output_name], axis=-1))
    graph = helper.make_graph(nodes, name, [_value(input_name, TensorProto.FLOAT, ["N", weights.shape[0]])],
                              [_value(output_name, TensorProto.FLOAT, ["N", weights.shape[1]])], inits)
    return _finish(graph)


def classifier(n_classes: int = 3, n_features: int = 4, *, seed: int = 0, softmax: bool = True) -> onnx.ModelProto:
    """A random linear classifier y = softmax(x @ W + b), weights drawn from `seed`."""
    rng = _rng(seed)
    weights = rng.normal(size=(n_features, n_classes))
    return linear(weights, rng.normal(size=(n_classes,)), softmax=softmax, name="classifier")


def memory_hungry(rows: int = 8192, cols: int = 4096, features: int = 8) -> onnx.ModelProto:
    """y = x + 0*sum(ones[rows, cols]): a tiny file that needs rows*cols*4 bytes (128 MiB) twice to run."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["big"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
         helper.make_node("Add", ["big", "big"], ["big2"]),
         helper.make_node("ReduceSum", ["big2"], ["s"], keepdims=0),
         helper.make_node("Mul", ["s", "zero"], ["s0"]),
         helper.make_node("Add", ["x", "s0"], ["y"])],
        "hungry", [_value("x", TensorProto.FLOAT, ["N", features])], [_value("y", TensorProto.FLOAT, ["N", features])],
        [_init("zero", np.array(0.0, dtype=np.float32)), _init("shape", np.array([rows, cols], dtype=np.int64))])
    return _finish(graph, ir_version=9)


def multi_input(*, seed: int = 0, n_out: int = 4) -> onnx.ModelProto:
    """Two inputs of two element types: image [N,3,8,8] float32 and mask [N,n_out] int64;
    y = (mean_hw(image) @ W) * float(mask), shape [N, n_out]."""
    rng = _rng(seed)
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["image"], ["pooled"], axes=[2, 3], keepdims=0),
         helper.make_node("MatMul", ["pooled", "W"], ["scores"]),
         helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["scores", "maskf"], ["y"])],
        "multi_input",
        [_value("image", TensorProto.FLOAT, ["N", 3, 8, 8]), _value("mask", TensorProto.INT64, ["N", n_out])],
        [_value("y", TensorProto.FLOAT, ["N", n_out])],
        [_init("W", rng.standard_normal((3, n_out)).astype(np.float32))])
    return _finish(graph)


def if_subgraph(features: int = 4) -> onnx.ModelProto:
    """A model with subgraphs: y = If(sum(x) > 0, then relu(x), else -x), both branches reading x from outside."""
    then_branch = helper.make_graph([helper.make_node("Relu", ["x"], ["then_y"])], "then_branch", [],
                                    [_value("then_y", TensorProto.FLOAT, ["N", features])])
    else_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["else_y"])], "else_branch", [],
                                    [_value("else_y", TensorProto.FLOAT, ["N", features])])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("Greater", ["total", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "if_subgraph", [_value("x", TensorProto.FLOAT, ["N", features])],
        [_value("y", TensorProto.FLOAT, ["N", features])], [_init("zero", np.array(0.0, dtype=np.float32))])
    return _finish(graph)


def renamed(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every node and value renamed and the initializers in reverse order."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    keep = {v.name for v in graph.input if v.name not in {t.name for t in graph.initializer}}
    keep |= {v.name for v in graph.output}
    mapping = {}
    for t in graph.initializer:
        mapping[t.name] = f"zz_{t.name}_renamed"
    for node in graph.node:
        node.name = f"renamed_{node.name or node.op_type}"
        for k, name in enumerate(node.output):
            if name and name not in keep:
                mapping.setdefault(name, f"v_{len(mapping)}")
    for t in graph.initializer:
        t.name = mapping[t.name]
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
    for value in graph.value_info:
        value.name = mapping.get(value.name, value.name)
    reordered = list(graph.initializer)[::-1]
    del graph.initializer[:]
    graph.initializer.extend(reordered)
    return out


# ---------------------------------------------------------------- ONNX, quantized (QDQ)

class _Calibration:
    """A calibration reader for onnxruntime.quantization.quantize_static: one sample per batch."""

    def __init__(self, samples: dict[str, np.ndarray]):
        n = len(next(iter(samples.values())))
        self.batches = iter([{name: array[i:i + 1] for name, array in samples.items()} for i in range(n)])

    def get_next(self):
        return next(self.batches, None)


def quantize_qdq(fp32: Path, out: Path, samples: dict[str, np.ndarray], *, nodes_to_exclude=(),
                 extra_options: dict | None = None) -> Path:
    """Static QDQ quantization (uint8 activations, int8 weights), calibrated one sample at a time on `samples`."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(str(fp32), str(out), _Calibration(samples), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    nodes_to_exclude=list(nodes_to_exclude), extra_options=extra_options or {})
    return Path(out)


def quantize_dynamic_int8(fp32: Path, out: Path) -> Path:
    """Dynamic quantization: int8 weights, activations quantized at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8)
    return Path(out)


@functools.cache
def quantized_path(exclude_middle: bool = False) -> Path:
    """conv_net quantized with QDQ (uint8 activations, int8 weights); optionally leave conv2 in float."""
    src = save(conv_net(), "float_for_quant.onnx")
    out = cache_dir() / ("quant_island.onnx" if exclude_middle else "quant.onnx")
    calibration = {"x": _rng(1).standard_normal((8, 3, 8, 8)).astype(np.float32)}
    return quantize_qdq(src, out, calibration, nodes_to_exclude=["conv2"] if exclude_middle else [],
                        extra_options={"ForceQuantizeNoInputCheck": True})


def quantized_net(exclude_middle: bool = False) -> onnx.ModelProto:
    return onnx.load(quantized_path(exclude_middle))


def with_activation_scales(model: onnx.ModelProto, scale: float, zero_point: int | None = None) -> onnx.ModelProto:
    """Overwrite the scale (and zero point) of every activation QuantizeLinear: an uncalibrated model."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    for node in out.graph.node:
        if node.op_type != "QuantizeLinear":
            continue
        scale_t = inits[node.input[1]]
        scale_t.CopyFrom(_init(scale_t.name, np.array(scale, dtype=np.float32)))
        if zero_point is not None and len(node.input) > 2:
            zp_t = inits[node.input[2]]
            dtype = numpy_helper.to_array(zp_t).dtype
            zp_t.CopyFrom(_init(zp_t.name, np.array(zero_point, dtype=dtype)))
    return out


# ---------------------------------------------------------------- TFLite (TensorFlow in the tests only)

TFLITE_EXTRA = ("tensorflow", "ai_edge_litert")


def tflite_extra_missing() -> list[str]:
    """The modules of the optional tflite extra that are not installed (found without importing them:
    importing TensorFlow costs 5-12 s)."""
    import importlib.util

    return [name for name in TFLITE_EXTRA if importlib.util.find_spec(name) is None]


def tflite_extra_problem() -> str | None:
    """Why the tflite extra cannot be used here, or None."""
    missing = tflite_extra_missing()
    if missing:
        return f"the optional tflite extra is not installed (missing {', '.join(missing)}): pip install 'tiergate[tflite]'"
    return None


def require_tflite_extra() -> None:
    """Skip the calling test (or fixture) with the reason when the tflite extra is absent
    (tests can say the same with the `tflite_extra` marker)."""
    import pytest

    problem = tflite_extra_problem()
    if problem:
        pytest.skip(problem)


def _tf():
    import os

    require_tflite_extra()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow

    return tensorflow


def _keras_net(middle=None, seed: int = 0):
    """x[1,8,8,3] -> Conv2D+relu -> [middle] -> Conv2D+relu -> Conv2D(1x1) -> y."""
    tf = _tf()
    tf.keras.utils.set_random_seed(seed)
    inp = tf.keras.Input((8, 8, 3), batch_size=1)
    x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
    if middle is not None:
        x = tf.keras.layers.Lambda(middle)(x)
    x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(x)
    x = tf.keras.layers.Conv2D(4, 1)(x)
    return tf.keras.Model(inp, x)


def _representative():
    rng = _rng(1)
    for _ in range(8):
        yield [rng.standard_normal((1, 8, 8, 3)).astype(np.float32)]


def _convert(model, mode: str) -> bytes:
    tf = _tf()
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if mode in ("int8", "mixed"):
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _representative
    if mode == "int8":
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    return converter.convert()


@functools.cache
def tflite_bytes(kind: str) -> bytes:
    """'float': fused float CNN; 'int8': fully int8; 'island': int8 with a float SIN in the middle
    (no int8 SIN kernel, so the converter dequantizes around it); 'int8_io_float': int8 inside,
    float input/output (the island's clean twin); 'argmax': a builtin XNNPACK does not take."""
    tf = _tf()
    middles = {"island": lambda v: tf.math.sin(v), "argmax": lambda v: tf.cast(tf.argmax(v, axis=-1), tf.float32)}
    mode = {"float": "float", "int8": "int8", "island": "mixed", "int8_io_float": "mixed", "argmax": "float"}[kind]
    if kind == "argmax":
        inp = tf.keras.Input((8, 8, 3), batch_size=1)
        x = tf.keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inp)
        return _convert(tf.keras.Model(inp, tf.keras.layers.Lambda(middles["argmax"])(x)), mode)
    return _convert(_keras_net(middles.get(kind)), mode)


def tflite_mlp_pair(folder: Path, features: int = 8, outputs: int = 4) -> dict[str, Path]:
    """An FP32 and a full-INT8 TFLite model of a small dense net y = softmax(relu(x @ W1) @ W2),
    input x [None, features]: {"fp32": path, "int8": path}."""
    tf = _tf()
    rng = _rng(2)
    w1 = tf.constant(rng.standard_normal((features, 16)).astype(np.float32))
    w2 = tf.constant(rng.standard_normal((16, outputs)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, features], tf.float32, name="x")])
    def net(x):
        return tf.nn.softmax(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2))

    concrete = net.get_concrete_function()
    fp32 = tf.lite.TFLiteConverter.from_concrete_functions([concrete], net).convert()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete], net)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: (
        [rng.standard_normal((1, features)).astype(np.float32)] for _ in range(64))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.int8
    converter.inference_output_type = tf.int8
    int8 = converter.convert()
    return {"fp32": save_tflite(fp32, "net_fp32.tflite", folder), "int8": save_tflite(int8, "net_int8.tflite", folder)}


def save_tflite(data: bytes, name: str, folder: Path | None = None) -> Path:
    path = (folder or cache_dir()) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _schema():
    require_tflite_extra()
    import ai_edge_litert.schema_py_generated as schema

    return schema


def _unpack(data: bytes):
    return _schema().ModelT.InitFromPackedBuf(data, 0)


def _pack(model) -> bytes:
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _opcode(model, builtin: int, custom: str | None = None) -> int:
    schema = _schema()
    for i, code in enumerate(model.operatorCodes):
        name = code.customCode.decode() if isinstance(code.customCode, bytes) else code.customCode
        if max(code.builtinCode, code.deprecatedBuiltinCode) == builtin and name == custom:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
    code.customCode = custom
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _new_tensor(model, like: int, name: str, data: np.ndarray | None = None) -> int:
    import copy

    schema = _schema()
    graph = model.subgraphs[0]
    tensor = copy.deepcopy(graph.tensors[like])
    tensor.name = name
    tensor.buffer = 0
    if data is not None:
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(data.tobytes(), dtype=np.uint8)
        model.buffers.append(buffer)
        tensor.buffer = len(model.buffers) - 1
        tensor.shape = list(data.shape)
        tensor.shapeSignature = None
        tensor.type = {np.dtype(np.float32): 0, np.dtype(np.int32): 2}[data.dtype]
        tensor.quantization = None
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _operator(model, code: int, inputs: list[int], outputs: list[int]):
    op = _schema().OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = code, inputs, outputs
    return op


def tflite_resaved(data: bytes) -> bytes:
    """The same model written differently: every tensor renamed, the constant buffers in reverse order."""
    model = _unpack(data)
    graph = model.subgraphs[0]
    order = [0] + list(range(len(model.buffers) - 1, 0, -1))
    where = {old: new for new, old in enumerate(order)}
    model.buffers = [model.buffers[i] for i in order]
    for i, tensor in enumerate(graph.tensors):
        tensor.buffer = where[tensor.buffer]
        tensor.name = f"renamed_{i}"
    return _pack(model)


def tflite_unfused(noop: bool) -> bytes:
    """The float CNN with its first conv's RELU split off as a separate op (after a same-shape
    RESHAPE when noop): the pair no longer fuses."""
    schema = _schema()
    model = _unpack(tflite_bytes("float"))
    graph = model.subgraphs[0]
    conv = graph.operators[0]
    conv.builtinOptions.fusedActivationFunction = schema.ActivationFunctionType.NONE
    out = conv.outputs[0]
    pre = _new_tensor(model, out, "conv_pre_activation")
    conv.outputs = [pre]
    ops, last = [], pre
    if noop:
        shape = _new_tensor(model, out, "same_shape", np.array(graph.tensors[out].shape, dtype=np.int32))
        moved = _new_tensor(model, out, "reshaped")
        ops.append(_operator(model, _opcode(model, schema.BuiltinOperator.RESHAPE), [last, shape], [moved]))
        last = moved
    ops.append(_operator(model, _opcode(model, schema.BuiltinOperator.RELU), [last], [out]))
    graph.operators[1:1] = ops
    return _pack(model)


def tflite_softmax_in_float(data: bytes) -> bytes:
    """An integer TFLite classifier (..., SOFTMAX, DEQUANTIZE to a float output, as TFLiteConverter writes it) with its
    SOFTMAX forced to float: DEQUANTIZE first, then a float SOFTMAX writes the output (what a selective quantizer
    leaving the softmax in float writes). Same argmax as the integer model wherever its top score is not tied."""
    schema = _schema()
    model = _unpack(data)
    graph = model.subgraphs[0]
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    ops = graph.operators
    si = next(i for i, op in enumerate(ops) if codes[op.opcodeIndex] == schema.BuiltinOperator.SOFTMAX)
    di = next(i for i, op in enumerate(ops) if codes[op.opcodeIndex] == schema.BuiltinOperator.DEQUANTIZE
              and op.inputs[0] == ops[si].outputs[0])
    softmax, dequantize = ops[si], ops[di]
    logits, probs = softmax.inputs[0], dequantize.outputs[0]
    floats = _new_tensor(model, probs, "logits_float")
    graph.tensors[floats].shape = list(graph.tensors[logits].shape)
    signature = graph.tensors[logits].shapeSignature
    graph.tensors[floats].shapeSignature = None if signature is None else list(signature)
    dequantize.inputs, dequantize.outputs = [logits], [floats]
    softmax.inputs, softmax.outputs = [floats], [probs]
    graph.operators = [op for i, op in enumerate(ops) if i not in (si, di)] + [dequantize, softmax]
    return _pack(model)


def tflite_unfolded_bn() -> bytes:
    """The float CNN with a per-channel MUL and ADD (an unfolded batch norm) after its last conv."""
    schema = _schema()
    model = _unpack(tflite_bytes("float"))
    graph = model.subgraphs[0]
    conv = graph.operators[-1]
    out = conv.outputs[0]
    channels = graph.tensors[out].shape[-1]
    raw = _new_tensor(model, out, "conv_raw")
    scaled = _new_tensor(model, out, "bn_scaled")
    gamma = _new_tensor(model, out, "bn_gamma", np.full(channels, 1.5, np.float32))
    beta = _new_tensor(model, out, "bn_beta", np.full(channels, 0.2, np.float32))
    conv.outputs = [raw]
    graph.operators += [
        _operator(model, _opcode(model, schema.BuiltinOperator.MUL), [raw, gamma], [scaled]),
        _operator(model, _opcode(model, schema.BuiltinOperator.ADD), [scaled, beta], [out]),
    ]
    for op in graph.operators[-2:]:
        op.builtinOptionsType = {schema.BuiltinOperator.MUL: schema.BuiltinOptions.MulOptions}.get(
            model.operatorCodes[op.opcodeIndex].builtinCode, schema.BuiltinOptions.AddOptions)
        op.builtinOptions = (schema.MulOptionsT() if op.builtinOptionsType == schema.BuiltinOptions.MulOptions
                             else schema.AddOptionsT())
    return _pack(model)


def tflite_activation_ranges(scale: float, zero_point: int) -> bytes:
    """The int8 CNN with every activation tensor's (scale, zero point) overwritten: uncalibrated."""
    model = _unpack(tflite_bytes("int8"))
    graph = model.subgraphs[0]
    for tensor in graph.tensors:
        q = tensor.quantization
        if tensor.type == 9 and model.buffers[tensor.buffer].data is None and q is not None and q.scale is not None:
            q.scale, q.zeroPoint = [scale], [zero_point]
    return _pack(model)


def tflite_custom_op() -> bytes:
    """The float CNN with its last conv turned into a custom op no stock runtime has a kernel for."""
    schema = _schema()
    model = _unpack(tflite_bytes("float"))
    op = model.subgraphs[0].operators[-1]
    op.opcodeIndex = _opcode(model, schema.BuiltinOperator.CUSTOM, "TiergateMysteryOp")
    op.builtinOptionsType, op.builtinOptions = 0, None
    return _pack(model)


def stateful(*, with_sr: bool = True, seed: int = 0, samples: int = 8, units: int = 4) -> onnx.ModelProto:
    """A recurrent model fed as silero VAD is: `input` [N, samples], `state` [2, N, units] (batch on axis 1),
    `sr` a 0-d int64 constant; outputs `output` [N, 1] = sigmoid(input @ W + sum_0(state) @ V + sr * c) and
    `stateN` [2, N, units] = state / 2 + input @ U (batch on axis 1). `with_sr=False`: `sr` is a graph constant
    (the signature changes, as in a variant with no `sr` input)."""
    rng = _rng(seed)
    sr_node = [] if with_sr else [helper.make_node("Constant", [], ["sr"], value=helper.make_tensor(
        "sr_value", TensorProto.INT64, [], [16000]))]
    nodes = sr_node + [
        helper.make_node("MatMul", ["input", "W"], ["a"]),
        helper.make_node("ReduceSum", ["state", "axis0"], ["s0"], keepdims=0),
        helper.make_node("MatMul", ["s0", "V"], ["b"]),
        helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["srf", "c"], ["src"]),
        helper.make_node("Add", ["a", "b"], ["ab"]), helper.make_node("Add", ["ab", "src"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["output"]),
        helper.make_node("Mul", ["state", "half"], ["kept"]), helper.make_node("MatMul", ["input", "U"], ["new"]),
        helper.make_node("Add", ["kept", "new"], ["stateN"]),
    ]
    inputs = [_value("input", TensorProto.FLOAT, ["batch", samples]),
              _value("state", TensorProto.FLOAT, [2, "batch", units])]
    if with_sr:
        inputs.append(_value("sr", TensorProto.INT64, []))
    graph = helper.make_graph(
        nodes, "stateful", inputs,
        [_value("output", TensorProto.FLOAT, ["batch", 1]), _value("stateN", TensorProto.FLOAT, [2, "batch", units])],
        [_init("W", rng.standard_normal((samples, 1)).astype(np.float32)),
         _init("V", rng.standard_normal((units, 1)).astype(np.float32)),
         _init("U", rng.standard_normal((samples, units)).astype(np.float32)),
         _init("axis0", np.array([0], np.int64)), _init("c", np.array(1e-5, np.float32)),
         _init("half", np.array(0.5, np.float32))])
    return _finish(graph)
