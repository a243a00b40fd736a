"""Which ONNX nodes an onnxruntime execution provider has a kernel for.

The kernel registry is asked of onnxruntime itself (get_all_opkernel_def: op,
domain, provider, opset version range, accepted types), so the answer follows
the installed onnxruntime, not a hand-kept list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import onnx
import onnx.defs

DEFAULT_DOMAINS = ("", "ai.onnx")
# ops onnxruntime turns into initializers while loading the model: no kernel, and none needed
FOLDED_AT_LOAD = frozenset({("", "Constant")})


@dataclass(frozen=True)
class Kernel:
    start: int
    end: int
    types: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    decomposed: bool = False      # no kernel, but onnxruntime expands the op's function body
    folded: bool = False          # no kernel needed: folded into an initializer at load (Constant)
    cast_fallback: bool = False   # no float16 kernel: onnxruntime inserts Casts and runs it in float32


@cache
def kernels(provider: str) -> dict[tuple[str, str], tuple[Kernel, ...]]:
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    found: dict[tuple[str, str], list[Kernel]] = {}
    for k in ort_state.get_all_opkernel_def():
        if k.provider == provider:
            start, end = k.version_range
            types = {name: tuple(v) for name, v in k.type_constraints.items()}
            found.setdefault((k.domain, k.op_name), []).append(Kernel(start, end, types))
    return {key: tuple(v) for key, v in found.items()}


def has_provider(provider: str) -> bool:
    return bool(kernels(provider))


@cache
def _ort_schemas() -> dict[tuple[str, str], object]:
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return {(s.domain, s.name): s for s in ort_state.get_all_operator_schema()}


def _schema(domain: str, op: str, opset: int):
    try:
        return onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return _ort_schemas().get((domain, op))


def check_node(node, opsets: dict[str, int], dtypes: dict[str, str], provider: str) -> Verdict:
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    if (domain, node.op) in FOLDED_AT_LOAD:
        return Verdict(True, folded=True)
    opset = opsets.get(domain, 1)
    schema = _schema(domain, node.op, opset)
    if schema is None:
        return Verdict(False, f"{_label(domain, node.op)} is not an operator onnxruntime knows")
    version = schema.since_version
    candidates = [k for k in kernels(provider).get((domain, node.op), ()) if k.start <= version <= k.end]
    if not candidates:
        if getattr(schema, "has_function", False) or getattr(schema, "has_context_dependent_function", False):
            return Verdict(True, f"{_label(domain, node.op)} has no {provider} kernel; onnxruntime runs "
                                 f"its function body (decomposed, unfused)", decomposed=True)
        return Verdict(False, f"no {provider} kernel for {_label(domain, node.op)} (opset {version})")
    actual = _actual_types(schema, node, dtypes)
    if not any(_accepts(k, actual) for k in candidates):
        as_float = {p: t.replace("float16", "float") for p, t in actual.items()}
        if as_float != actual and any(_accepts(k, as_float) for k in candidates):
            return Verdict(False, f"no float16 {provider} kernel for {_label(domain, node.op)}: onnxruntime "
                                  f"inserts Casts and runs it in float32", cast_fallback=True)
        shown = ", ".join(f"{p}={t}" for p, t in sorted(actual.items()))
        return Verdict(False, f"no {provider} kernel for {_label(domain, node.op)} with {shown}")
    return Verdict(True)


def load_problem(path) -> str | None:
    """The host onnxruntime's own message when it refuses to create a session for the model (CPU EP,
    the default optimization level a plain session uses, as the harness; no inference), or None when it
    loads: the last word on "unsupported" at file level. Cached per file content."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError:
        return None
    return _load_problem(str(path), stat.st_size, stat.st_mtime_ns)


@cache
def _load_problem(path: str, size: int, mtime_ns: int) -> str | None:
    import onnxruntime as ort

    from tiergate.ort_session import session

    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        session(path, options)
    except Exception as exc:  # noqa: BLE001 - any refusal is the answer, in the runtime's words
        return runtime_words(str(exc)) or type(exc).__name__
    return None


def host_version() -> str:
    import onnxruntime as ort

    return ort.__version__


# "/onnxruntime_src/onnxruntime/core/graph/model.cc:256 onnxruntime::Model::Model(...) " and "Load model from X
# failed:": where in onnxruntime's source the refusal was raised, not what it says
_SOURCE = re.compile(r"/onnxruntime_src/\S+:\d+ ")
_LOAD_FROM = re.compile(r"Load model from .*? failed:")
_IR = re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)")
_OPSET = re.compile(r"Opset (\d+) is under development.*?official support for domain (\S+) is till opset (\d+)")


def runtime_words(text: str, limit: int = 800) -> str:
    """onnxruntime's message on one line, without its source locations and C++ signatures."""
    text = _LOAD_FROM.sub("", " ".join(str(text).split()))
    while (match := _SOURCE.search(text)) is not None:
        text = text[:match.start()] + _skip_signature(text[match.end():])
    return text.strip()[:limit]


def _skip_signature(rest: str) -> str:
    """Drop a leading "type name(args) " (a C++ function signature, parentheses balanced)."""
    head = rest.find("(")
    if head < 0 or " " not in rest[:head].strip() and "::" not in rest[:head]:
        return rest
    depth = 0
    for k in range(head, len(rest)):
        depth += {"(": 1, ")": -1}.get(rest[k], 0)
        if depth == 0:
            return re.sub(r"^\S*\s*", "", rest[k + 1:])     # and what trails it (::<lambda()>, const)
    return rest


def why_refused(message: str, version: str | None = None) -> str:
    """An IR version or opset beyond what onnxruntime `version` (default: the host's) reads, named as such
    ("" otherwise)."""
    version = version or host_version()
    ir = _IR.search(message)
    if ir:
        return f"IR version {ir.group(1)} is newer than onnxruntime {version} reads (up to IR version {ir.group(2)})"
    opset = _OPSET.search(message)
    if opset:
        return (f"opset {opset.group(1)} of domain {opset.group(2)} is newer than onnxruntime {version} supports "
                f"(up to opset {opset.group(3)})")
    return ""


def _label(domain: str, op: str) -> str:
    return f"{domain}::{op}" if domain else op


def _onnx_type(dtype: str) -> str:
    return {"float32": "float", "float64": "double"}.get(dtype, dtype)


def _actual_types(schema, node, dtypes: dict[str, str]) -> dict[str, str]:
    """Type parameter (T, T1...) -> the element type the node actually gives it."""
    actual: dict[str, str] = {}
    pairs = list(zip(schema.inputs, node.inputs)) + list(zip(schema.outputs, node.outputs))
    for formal, tensor in pairs:
        type_str = getattr(formal, "type_str", None) or getattr(formal, "typeStr", "")
        if tensor and tensor in dtypes and not type_str.startswith(("tensor(", "seq(")):
            actual.setdefault(type_str, f"tensor({_onnx_type(dtypes[tensor])})")
    return actual


def _accepts(kernel: Kernel, actual: dict[str, str]) -> bool:
    return all(t in kernel.types[p] for p, t in actual.items() if p in kernel.types)
