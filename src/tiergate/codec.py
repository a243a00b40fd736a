"""One JSON codec for tiergate's typed results: dataclasses to JSON and back, exactly.

`encode(obj)` turns a dataclass (nested dataclasses, dicts, lists, tuples, numpy
scalars, paths) into JSON-ready values; `decode(cls, data)` rebuilds the typed
object from the dataclass's own type hints. Floats JSON cannot hold are written
as the strings "nan", "inf" and "-inf" and read back as floats wherever the field
is typed float, so `decode(type(x), encode(x))` gives x back, NaN and infinities
included. A class may take over its own shape with `__json_encode__(self)` and a
classmethod `__json_decode__(cls, data)` (e.g. for tuple-keyed dicts). Numpy values are
encoded when numpy is loaded; this module never imports it (a saved decision decodes
without numpy).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import types
import typing
from pathlib import Path

NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode(obj):
    """JSON-ready values from a typed object (non-finite floats as "nan"/"inf"/"-inf")."""
    if hasattr(obj, "__json_encode__") and not isinstance(obj, type):
        return encode(obj.__json_encode__())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    np = sys.modules.get("numpy")      # never imported here: without numpy loaded, nothing is a numpy value
    if np is not None:
        if isinstance(obj, np.generic):
            obj = obj.item()
        if isinstance(obj, np.ndarray):
            return encode(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def decode(tp, data):
    """The object of type `tp` (a dataclass, or a typing form of them) that `encode` wrote as `data`."""
    if tp is typing.Any or tp is object:
        return data
    if isinstance(tp, type) and hasattr(tp, "__json_decode__"):
        return tp.__json_decode__(data)
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, data)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _decode_union(args, data)
    if origin in (list, tuple) or tp in (list, tuple):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v) for v in data)
        if origin is tuple and args:
            return tuple(decode(a, v) for a, v in zip(args, data))
        items = [decode(args[0] if args else typing.Any, v) for v in data]
        return tuple(items) if (origin or tp) is tuple else items
    if origin is dict or tp is dict:
        value_type = args[1] if len(args) == 2 else typing.Any
        return {k: decode(value_type, v) for k, v in data.items()}
    if tp is float and isinstance(data, str):
        return NON_FINITE[data]
    return data          # numbers keep the type JSON gave them (0 stays 0, 0.0 stays 0.0): exact round trip


def _decode_union(args: tuple, data):
    if data is None and type(None) in args:
        return None
    if isinstance(data, str) and data in NON_FINITE and float in args:
        return NON_FINITE[data]
    for arg in args:
        if dataclasses.is_dataclass(arg) and isinstance(data, dict):
            return decode(arg, data)
    return data


@functools.lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _decode_dataclass(cls, data: dict):
    hints = _hints(cls)
    kwargs = {f.name: decode(hints.get(f.name, typing.Any), data[f.name])
              for f in dataclasses.fields(cls) if f.init and f.name in data}
    return cls(**kwargs)
