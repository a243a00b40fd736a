"""TFLite (flatbuffer, schema 3) into an Artifact, with the pure-Python `tflite` schema package."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path

import tflite

from tiergate.artifact.model import Artifact, Node, QuantParams, TensorSpec
from tiergate.errors import InputError

_TYPE_NAMES = {v: k.lower() for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}
_OPTION_CLASSES = {v: k for k, v in vars(tflite.BuiltinOptions).items() if not k.startswith("_")}
_ACTIVATIONS = {v: k for k, v in vars(tflite.ActivationFunctionType).items() if not k.startswith("_")}
_CORRUPT = (struct.error, IndexError, ValueError, TypeError, AttributeError, UnicodeDecodeError)


@dataclass
class TFLiteHandle:
    """What the fingerprint and lint rules need beyond the Artifact: the parsed model and constants."""

    model: tflite.Model
    data: bytes
    tensor_names: list[str]                                  # by tensor index (unique)
    constants: dict[str, memoryview] = field(default_factory=dict)  # tensor name -> buffer bytes
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def load_tflite(path: Path, data: bytes) -> Artifact:
    try:
        return _load(path, data)
    except InputError:
        raise
    except _CORRUPT as exc:
        raise InputError(f"{path}: TFLite file is truncated or corrupt (flatbuffer does not parse: "
                         f"{type(exc).__name__})") from None


def _load(path: Path, data: bytes) -> Artifact:
    model = tflite.Model.GetRootAs(data, 0)
    if model.SubgraphsLength() < 1:
        raise InputError(f"{path}: TFLite model has no subgraph")
    graph = model.Subgraphs(0)
    names = _unique_names(graph)
    handle = TFLiteHandle(model=model, data=data, tensor_names=names)
    dtypes, quant, inits = {}, {}, {}
    for index, name in enumerate(names):
        tensor = graph.Tensors(index)
        dtypes[name] = _TYPE_NAMES.get(tensor.Type(), f"type{tensor.Type()}")
        handle.shapes[name] = _shape(tensor)
        params = _quant(name, tensor, dtypes[name])
        if params:
            quant[name] = params
        blob = _buffer(path, model, data, tensor.Buffer())
        if blob is not None:
            handle.constants[name] = blob
            inits[name] = (handle.shapes[name], dtypes[name])
    codes = [_op_code(model.OperatorCodes(i)) for i in range(model.OperatorCodesLength())]
    nodes = [_node(i, graph.Operators(i), codes, names) for i in range(graph.OperatorsLength())]
    return Artifact(
        path=path,
        format="tflite",
        sha256=hashlib.sha256(data).hexdigest(),
        size_bytes=len(data),
        version=f"schema {model.Version()}",
        inputs=[_spec(graph, i, names) for i in _ints(graph.InputsAsNumpy())],
        outputs=[_spec(graph, i, names) for i in _ints(graph.OutputsAsNumpy())],
        nodes=nodes,
        quant=quant,
        initializers=inits,
        metadata=_metadata(model),
        tensor_dtypes=dtypes,
        handle=handle,
    )


def _ints(array) -> list[int]:
    return [] if isinstance(array, int) else [int(x) for x in array]


def _unique_names(graph) -> list[str]:
    names = [(graph.Tensors(i).Name() or b"").decode() for i in range(graph.TensorsLength())]
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    return [n if n and seen[n] == 1 else f"{n}#{i}" for i, n in enumerate(names)]


def _shape(tensor) -> tuple[int, ...]:
    return tuple(_ints(tensor.ShapeAsNumpy()))


def _spec(graph, index: int, names: list[str]) -> TensorSpec:
    tensor = graph.Tensors(index)
    shape = _shape(tensor)
    signature = _ints(tensor.ShapeSignatureAsNumpy())
    if len(signature) == len(shape):  # -1 in the signature is a dynamic dimension
        shape = tuple(None if s < 0 else d for d, s in zip(shape, signature))
    return TensorSpec(names[index], shape, _TYPE_NAMES.get(tensor.Type(), f"type{tensor.Type()}"))


def _quant(name: str, tensor, dtype: str) -> QuantParams | None:
    q = tensor.Quantization()
    if q is None or q.ScaleLength() == 0:
        return None
    scales = [float(s) for s in q.ScaleAsNumpy()]
    zeros = _ints(q.ZeroPointAsNumpy()) or [0] * len(scales)
    axis = int(q.QuantizedDimension()) if len(scales) > 1 else None
    return QuantParams(tensor=name, scale=tuple(scales), zero_point=tuple(zeros), dtype=dtype, axis=axis)


def _buffer(path: Path, model, data: bytes, index: int) -> memoryview | None:
    """A constant tensor's bytes (inline, or at an offset for large models); None for activations."""
    if index <= 0 or index >= model.BuffersLength():
        return None
    buf = model.Buffers(index)
    if buf.Offset() > 1:
        end = buf.Offset() + buf.Size()
        if end > len(data):
            raise InputError(f"{path}: TFLite file is truncated (buffer {index} ends at byte {end}, "
                             f"file has {len(data)})")
        return memoryview(data)[buf.Offset():end]
    if buf.DataLength() == 0:
        return None
    array = buf.DataAsNumpy()
    return memoryview(array).cast("B")


def _op_code(code) -> str:
    builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
    if builtin == tflite.BuiltinOperator.CUSTOM:
        return (code.CustomCode() or b"CUSTOM").decode()
    return tflite.BUILTIN_OPCODE2NAME.get(builtin, f"BUILTIN_{builtin}")


def _node(index: int, op, codes: list[str], names: list[str]) -> Node:
    name = codes[op.OpcodeIndex()]
    builtin = name in tflite.BUILTIN_OPCODE2NAME.values() or name.startswith("BUILTIN_")
    outputs = [names[i] for i in _ints(op.OutputsAsNumpy())]
    return Node(
        index=index,
        op=name,
        name=outputs[0] if outputs else f"op{index}",
        inputs=["" if i < 0 else names[i] for i in _ints(op.InputsAsNumpy())],
        outputs=outputs,
        attributes=_options(op) if builtin else {"custom_code": name},
        domain="" if builtin else ("flex" if name.startswith("Flex") else "custom"),
    )


def _options(op) -> dict:
    """The operator's builtin options as plain values, read generically from the generated class."""
    kind = _OPTION_CLASSES.get(op.BuiltinOptionsType(), "NONE")
    table = op.BuiltinOptions()
    if kind == "NONE" or table is None or not hasattr(tflite, kind):
        return {}
    options = getattr(tflite, kind)()
    options.Init(table.Bytes, table.Pos)
    values = {}
    for attr, fn in vars(type(options)).items():
        if attr.startswith("_") or attr in ("Init",) or not callable(fn) or fn.__code__.co_argcount != 1:
            continue
        if attr.endswith(("IsNone", "Length")) or "GetRootAs" in attr or attr.endswith("BufferHasIdentifier"):
            continue
        values[_snake(attr.removesuffix("AsNumpy"))] = _plain(getattr(options, attr)())
    if "fused_activation_function" in values:
        values["fused_activation_function"] = _ACTIVATIONS.get(values["fused_activation_function"], "?")
    return values


def _plain(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, (int, float, bool, str)) or value is None else type(value).__name__


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def _metadata(model) -> dict[str, str]:
    meta = {"subgraphs": str(model.SubgraphsLength())}
    description = model.Description()
    if description:
        meta["description"] = description.decode("utf-8", "replace")
    return meta
