"""Every ONNX type as text: tensors of any element type, sparse tensors, sequences, optionals, maps,
and untyped or partially typed values (a Loop body's inputs often declare no type at all).

`type_text(type_proto)` never raises: an element type this onnx does not know is `type<N>`, an unset
one `undefined`, a value with no type `?`. Nested types nest: `seq(optional(float32))`,
`map(int64,seq(float32))`, `sparse(float32)`.
"""

from __future__ import annotations

import functools

import onnx
from onnx import helper

UNTYPED = "?"
UNDEFINED = "undefined"


@functools.lru_cache(maxsize=None)
def dtype_name(elem_type: int) -> str:
    """A TensorProto element type as a numpy-style name (float32, bfloat16, float8_e4m3fn, int4, ...); a model's
    every tensor asks (thousands of times an intake: numpy's dtype names are slow to make), so each is kept."""
    if not elem_type:
        return UNDEFINED
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError, TypeError):
        try:
            return helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()
        except (KeyError, ValueError, TypeError):
            return f"type{elem_type}"


def type_text(tp: onnx.TypeProto, depth: int = 0) -> str:
    """The type of a value, whatever its kind (see the module's docstring)."""
    if depth > 64:
        return UNTYPED
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return dtype_name(tp.tensor_type.elem_type)
    if kind == "sparse_tensor_type":
        return f"sparse({dtype_name(tp.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({_inner(tp.sequence_type, depth)})"
    if kind == "optional_type":
        return f"optional({_inner(tp.optional_type, depth)})"
    if kind == "map_type":
        value = type_text(tp.map_type.value_type, depth + 1) if tp.map_type.HasField("value_type") else UNTYPED
        return f"map({dtype_name(tp.map_type.key_type)},{value})"
    return UNTYPED


def _inner(container, depth: int) -> str:
    return type_text(container.elem_type, depth + 1) if container.HasField("elem_type") else UNTYPED


def type_dims(tp: onnx.TypeProto, *, symbolic: bool = True) -> tuple[int | str | None, ...]:
    """The shape of a (sparse) tensor value; () for other kinds and for tensors without a shape.
    symbolic=False writes a symbolic dimension as None."""
    kind = tp.WhichOneof("value")
    if kind not in ("tensor_type", "sparse_tensor_type"):
        return ()
    holder = getattr(tp, kind)
    if not holder.HasField("shape"):
        return ()
    return tuple(d.dim_value if d.HasField("dim_value") else ((d.dim_param or None) if symbolic else None)
                 for d in holder.shape.dim)


def tensor_elem(tp: onnx.TypeProto) -> str | None:
    """The element type of a dense tensor value whose element type is set; None for anything else."""
    if tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type:
        return dtype_name(tp.tensor_type.elem_type)
    return None


def sparse_names(graph: onnx.GraphProto) -> list[str]:
    """The names of a graph's sparse initializers (the name of their values tensor)."""
    return [s.values.name for s in graph.sparse_initializer]


def plain_value(value):
    """An attribute value made JSON-friendly: bytes decoded, tensors, sparse tensors, types and graphs
    described (a graph by its name and node count)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, onnx.TensorProto):
        return {"tensor": dtype_name(value.data_type), "dims": list(value.dims)}
    if isinstance(value, onnx.SparseTensorProto):
        return {"sparse": dtype_name(value.values.data_type), "dims": list(value.dims)}
    if isinstance(value, onnx.TypeProto):
        return {"type": type_text(value), "dims": list(type_dims(value))}
    if isinstance(value, onnx.GraphProto):
        return {"graph": value.name, "nodes": len(value.node)}
    if isinstance(value, list):
        return [plain_value(v) for v in value if not isinstance(v, onnx.GraphProto)]
    return value
