"""TFLite pairing for `tiergate explain`: which candidate tensor holds the value of which FP32 tensor.

Read from the two flatbuffers (tiergate.artifact's loader: the `tflite` schema package), before any
tier runs; the dumps are keyed by the same unique tensor names (a name held by several tensors, or
none, becomes NAME#INDEX: the loader's rule, which containers/harness/tiergate_explain.py repeats).

1. Same name first: a candidate activation named like a reference activation, with as many values,
   holds that value (the converter keeps its tensor names across precisions).
2. Then structure. Both graphs are walked from their inputs, op by op, and every activation gets an
   identity made of what computes it: the op code, the identities of its activation inputs, the
   shapes of its constant inputs (and, when several ops share all of that, their order). So:
   - QUANTIZE and DEQUANTIZE of an activation (what the converter inserts at a float model's edges
     and around float islands) keep their input's identity: a re-quantized tensor holds the value it
     quantizes;
   - a fused activation (CONV_2D / FULLY_CONNECTED / ADD ... with fused_activation_function RELU,
     RELU6, RELU_N1_TO_1, TANH) and the same op followed by a separate RELU / RELU6 / ... op give the
     same identity;
   - constants include what is computed from constants only: the DEQUANTIZE of float16 or int8
     weights, so a dynamic-range model (float activations, int8 weights) or a float16 one has the
     float model's structure.
   A candidate tensor that a name pairs anchors its identity to the reference's: what follows it
   pairs even where the graphs differ upstream.
3. Each candidate activation whose identity a reference float tensor has is a pair; an integer one is
   dequantized with its own scale and zero point (per tensor). Everything else is listed, with why:
   per-channel quantization of an activation (the converter never makes one), a value the
   reference never holds (the input of an activation the reference fuses), an op with no
   counterpart, a tensor computed from unpaired ones, integer arithmetic (shapes, indices).

Where the file keeps it (converted with `serialize_debug_metadata=True`), each pair's location: the
TensorFlow ops the candidate's op was made from (name, type, and the Python line that made it when
the converter had the function's debug info: a tf.function, or a SavedModel saved with
save_debug_info), read from the "debug_metadata" buffer (tensorflow/compiler/mlir/lite/schema/
debug_metadata.fbs). TF 2.21 keeps it in float, float16 and dynamic-range conversions but its
full-integer quantizer drops it: then the paired reference op's location stands in. Without any,
a converter's tensor name is the ';'-joined names of the TensorFlow ops fused into the op.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tiergate.errors import InputError

TRANSPARENT = ("QUANTIZE", "DEQUANTIZE")
ACTIVATION_OPS = {"RELU": "RELU", "RELU6": "RELU6", "RELU_N1_TO_1": "RELU_N1_TO_1", "TANH": "TANH"}
COMMUTATIVE = ("ADD", "MUL", "MAXIMUM", "MINIMUM")
FLOAT = ("float32", "float16", "float64")
DEBUG_METADATA = "debug_metadata"


@dataclass
class Op:
    index: int
    opcode: str
    inputs: list[str]
    outputs: list[str]
    fused: str = "NONE"


@dataclass
class Graph:
    """The parts of a TFLite subgraph 0 the pairing reads, by unique tensor name."""

    path: Path
    ops: list[Op]
    inputs: list[str]
    outputs: list[str]
    dtypes: dict[str, str]
    shapes: dict[str, tuple]
    quant: dict                                  # name -> tiergate.artifact.model.QuantParams
    constants: set[str]                          # buffers, and values computed from constants only
    locations: dict[int, list[str]] = field(default_factory=dict)   # op index -> where it came from

    def __post_init__(self):
        self.producer = {out: op for op in self.ops for out in op.outputs}

    def activations(self) -> list[str]:
        """The graph's inputs and every op output that is not a constant, in op order."""
        names = list(dict.fromkeys(self.inputs))
        for op in self.ops:
            names += [out for out in op.outputs if out and out not in self.constants]
        return list(dict.fromkeys(names))

    def size(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return None if shape is None else math.prod(shape)


def read_graph(path: Path) -> Graph:
    """A TFLite file's subgraph 0, through tiergate's loader (which refuses corrupt files with one line)."""
    from tiergate.artifact import load_artifact

    art = load_artifact(Path(path))
    if art.format != "tflite":
        raise InputError(f"{path}: is {art.format}, not TFLite")
    handle = art.handle
    ops = [Op(n.index, n.op, list(n.inputs), list(n.outputs),
              str(n.attributes.get("fused_activation_function", "NONE") or "NONE")) for n in art.nodes]
    constants = set(handle.constants)
    for op in ops:               # what only constants feed is a constant too (DEQUANTIZE of weights, DENSIFY)
        fed = [name for name in op.inputs if name]
        if fed and all(name in constants for name in fed):
            constants.update(op.outputs)
    return Graph(Path(path), ops, [t.name for t in art.inputs], [t.name for t in art.outputs],
                 dict(art.tensor_dtypes), dict(handle.shapes), dict(art.quant), constants,
                 op_locations(handle.model, handle.data))


# --- identities ------------------------------------------------------------------------------------


class _Identities:
    """Structural identities, interned in one table shared by both graphs (equal identity = same value)."""

    def __init__(self):
        self.table: dict[tuple, int] = {}

    def of(self, key: tuple) -> int:
        return self.table.setdefault(key, len(self.table))

    def find(self, key: tuple) -> int | None:
        return self.table.get(key)

    def walk(self, graph: Graph, anchors: dict[str, int] | None = None) -> dict[str, int]:
        """Every activation's identity, {name: id}; `anchors` ({name: id}) override what structure says."""
        anchors = anchors or {}
        ident: dict[str, int] = {}
        for k, name in enumerate(graph.inputs):
            ident[name] = anchors.get(name, self.of(("input", k)))
        seen: Counter = Counter()
        for op in graph.ops:
            if all(out in graph.constants for out in op.outputs if out):
                continue
            ins = []
            for name in op.inputs:
                if name and name not in graph.constants:
                    if name not in ident:        # read before any op writes it (a state variable): its own
                        ident[name] = self.of(("loose", str(graph.path), name))
                    ins.append(ident[name])
            if op.opcode in TRANSPARENT and len(ins) == 1:
                results = [ins[0]]
            elif op.opcode in ACTIVATION_OPS and len(ins) == 1:
                results = [self.of(("act", ACTIVATION_OPS[op.opcode], ins[0]))]
            else:
                consts = tuple((slot, tuple(graph.shapes.get(name, ()))) for slot, name in enumerate(op.inputs)
                               if name and name in graph.constants)
                base = (op.opcode, tuple(sorted(ins)) if op.opcode in COMMUTATIVE else tuple(ins), consts)
                nth = seen[base]             # ops alike in all of that (two heads on one feature map): by order
                seen[base] += 1
                results = [self.of((base, nth, k)) for k in range(len(op.outputs))]
                if op.fused != "NONE":      # the op's fused activation: as the same op, then that activation op
                    results = [self.of(("act", op.fused, value)) for value in results]
            for out, value in zip(op.outputs, results):
                if out:
                    ident[out] = anchors.get(out, value)
        return ident


# --- the pairing -----------------------------------------------------------------------------------


@dataclass
class Pairing:
    """What the plan needs: the pairs (Source's fields, as dicts), why the rest is unpaired, the reference's
    outputs, and how many pairs each rule found."""

    sources: list[dict] = field(default_factory=list)
    unpaired: dict[str, str] = field(default_factory=dict)     # candidate tensor -> why it has no pair
    outputs: list[str] = field(default_factory=list)
    by_name: int = 0
    by_structure: int = 0


def pair(candidate: Path, reference: Path) -> Pairing:
    cand, ref = read_graph(candidate), read_graph(reference)
    ids = _Identities()
    r_ident = ids.walk(ref)
    r_acts = ref.activations()
    by_id: dict[int, str] = {}                 # the first float tensor of an identity stands for it
    other: dict[int, list[str]] = {}           # identities the reference holds only in other types
    for name in r_acts:
        if ref.dtypes.get(name) in FLOAT:
            by_id.setdefault(r_ident[name], name)
    for name in r_acts:
        if r_ident[name] not in by_id:
            other.setdefault(r_ident[name], []).append(name)
    anchors, notes = {}, {}
    r_set = set(r_acts)
    for name in cand.activations():            # 1. the same name, as many values
        if name in r_set:
            if cand.size(name) == ref.size(name):
                anchors[name] = r_ident[name]
            else:
                notes[name] = (f" (named like a reference tensor, but shaped {list(cand.shapes.get(name, ()))} "
                               f"against {list(ref.shapes.get(name, ()))})")
    c_ident = ids.walk(cand, anchors)          # 2. structure, from the inputs and the anchors
    out = Pairing(outputs=list(ref.outputs))
    r_order = {name: (op.index, op.opcode) for op in ref.ops for name in op.outputs}
    for name in cand.activations():
        fp32 = by_id.get(c_ident[name])
        why = _why(cand, name, fp32, c_ident[name], ids, by_id, other, ref, out.unpaired, notes.get(name, ""))
        if why:
            out.unpaired[name] = why
            continue
        index, opcode = r_order.get(fp32, (-1, "input"))
        q = cand.quant.get(name)
        integer = q is not None and cand.dtypes.get(name) not in FLOAT
        producer = cand.producer.get(name)
        out.sources.append(dict(
            fp32=fp32, tensor=name, op=opcode, order=index,
            scale=float(q.scale[0]) if integer else None, zero_point=int(q.zero_point[0]) if integer else 0,
            dtype=q.dtype if integer else "", nodes=[name] if integer else [],
            location=_location(cand, ref, producer, fp32),
            candidate_op=producer.opcode if producer else "input"))
        if name in anchors:
            out.by_name += 1
        else:
            out.by_structure += 1
    if not out.sources:
        raise InputError(f"{candidate} and {reference}: no tensor of the TFLite candidate holds a value of the "
                         "reference (neither by name nor by the graphs' structure): nothing to pair")
    out.sources.sort(key=lambda s: (s["order"], s["fp32"]))
    return out


def _location(cand: Graph, ref: Graph, producer: Op | None, fp32: str) -> list[str]:
    """Where the candidate's op came from, where its file keeps it; else the paired reference op's (TF 2.21's
    full-integer quantizer writes no debug metadata: measured)."""
    if producer is not None and cand.locations.get(producer.index):
        return list(cand.locations[producer.index])
    twin = ref.producer.get(fp32)
    return list(ref.locations.get(twin.index, [])) if twin is not None else []


def _why(cand: Graph, name: str, fp32: str | None, ident: int, ids: _Identities, by_id: dict[int, str],
         other: dict[int, list[str]], ref: Graph, unpaired: dict[str, str], note: str) -> str:
    """Why the candidate tensor `name` (identity `ident`) has no pair ("" when it has one)."""
    q = cand.quant.get(name)
    dtype = cand.dtypes.get(name, "?")
    if fp32 is not None:
        if None not in (cand.size(name), ref.size(fp32)) and cand.size(name) != ref.size(fp32):
            return (f"computed like {fp32}, but shaped {list(cand.shapes.get(name, ()))} against "
                    f"{list(ref.shapes.get(fp32, ()))}")
        if q is not None and len(q.scale) > 1 and dtype not in FLOAT:
            return (f"quantized per channel (axis {q.axis}, {len(q.scale)} scales): the converter gives an "
                    "activation one scale; this one is not dequantized here")
        if dtype not in FLOAT and q is None:
            return f"{dtype} with no quantization parameters: cannot be read as the reference's float values"
        return ""
    producer = cand.producer.get(name)
    if producer is None:
        return "a model input the reference does not have" + note
    if ident in other:
        kinds = sorted({ref.dtypes.get(r, "?") for r in other[ident]})
        return f"{', '.join(kinds)} in the reference too: shape or index arithmetic, not a layer's values" + note
    for f in dict.fromkeys(ACTIVATION_OPS.values()):
        wrapped = ids.find(("act", f, ident))
        if wrapped is not None and wrapped in by_id:
            return (f"the value before {f}: the reference fuses {f} into the op that makes {by_id[wrapped]}, so "
                    "it never holds this value" + note)
    upstream = [i for i in producer.inputs if i and i not in cand.constants and i in unpaired]
    if upstream:
        return f"computed by {producer.opcode} from {upstream[0]}, which is unpaired" + note
    return (f"no op of the reference computes {producer.opcode} of the same values (the graphs differ here)"
            + note)


def runtime_checked(sources: list, meta: dict) -> tuple[list, dict[str, str]]:
    """The pairs whose candidate op the tier's runtime runs as the file says (the dump script reports the
    graph the interpreter built: meta["candidate_graph"]) and whose values it kept (meta["*_overwritten"]:
    inputs an op ran in place over); the others, with why. A dump with no graph (an older script) is taken
    as it is."""
    graph = meta.get("candidate_graph") or {}
    ops = graph.get("ops") or []
    names = {int(k): v for k, v in (graph.get("names") or {}).items()}
    made = {}
    for op in ops:
        for t in op.get("outputs", []):
            made.setdefault(names.get(int(t), ""), op.get("op", ""))
    kept, reasons = [], {}
    lost = meta.get("candidate_overwritten") or {}
    lost_ref = meta.get("reference_overwritten") or {}
    for source in sources:
        if source.tensor in lost or source.fp32 in lost_ref:
            op, whose = (lost[source.tensor], "its") if source.tensor in lost else (lost_ref[source.fp32], "the FP32")
            reasons[source.tensor] = (f"the tier's runtime ran {op} in place over {whose} values (tflite-runtime "
                                      "does, even preserving all tensors): they are gone")
            continue
        want = getattr(source, "candidate_op", "")
        got = made.get(source.tensor, "input")
        # (an op this schema package does not name, BUILTIN_<code>, is not a disagreement)
        if ops and want and got != want and not want.startswith("BUILTIN_"):
            reasons[source.tensor] = f"the tier's runtime computes it with {got or 'no op'}, the file with {want}"
            continue
        kept.append(source)
    return kept, reasons


# --- where each op came from (debug metadata) --------------------------------------------------------


def op_locations(model, data: bytes) -> dict[int, list[str]]:
    """{op index: ["tf op name (TfType) at file.py:line", ...]} from the model's "debug_metadata" buffer,
    for subgraph 0; {} when the file keeps none (the converter's default) or it does not parse."""
    try:
        return _op_locations(model, data)
    except (IndexError, ValueError, TypeError, AttributeError, UnicodeDecodeError, KeyError, RecursionError):
        return {}


def _op_locations(model, data: bytes) -> dict[int, list[str]]:
    import flatbuffers
    from flatbuffers.table import Table

    graph = model.Subgraphs(0)
    sg_index = graph.DebugMetadataIndex()
    blob = None
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if (entry.Name() or b"").decode() == DEBUG_METADATA:
            buf = model.Buffers(entry.Buffer())
            if buf.Offset() > 1:
                blob = bytes(data[buf.Offset():buf.Offset() + buf.Size()])
            elif buf.DataLength():
                blob = buf.DataAsNumpy().tobytes()
    if blob is None or sg_index < 0:
        return {}
    reader = _FB(bytearray(blob), flatbuffers, Table)
    root = reader.root()
    kinds, values = reader.u8_vector(root, 0), reader.tables(root, 1)
    conversion = next((v for k, v in zip(kinds, values) if k == 1), None)    # ConversionDebugMetadata
    if conversion is None:
        return {}
    subgraphs = reader.tables(conversion, 0)
    attr_kinds, attrs = reader.u8_vector(conversion, 1), reader.tables(conversion, 2)
    if sg_index >= len(subgraphs):
        return {}
    per_op = reader.tables(subgraphs[sg_index], 0)
    locate = _Locations(reader, attr_kinds, attrs)
    found = {}
    for k in range(graph.OperatorsLength()):
        index = graph.Operators(k).DebugMetadataIndex()
        if 0 <= index < len(per_op):
            entries = []
            for a in reader.u32_vector(per_op[index], 0):
                entries += [e for e in locate.describe(a) if e not in entries]
            if entries:
                found[k] = entries
    return found


class _FB:
    """Just enough of a flatbuffer table reader for debug_metadata.fbs (no generated code ships for it)."""

    def __init__(self, buf: bytearray, flatbuffers, table_class):
        self.buf, self.fb, self.Table = buf, flatbuffers, table_class
        self.N = flatbuffers.number_types

    def root(self):
        return self.Table(self.buf, self.fb.encode.Get(self.fb.packer.uoffset, self.buf, 0))

    def _field(self, t, slot: int) -> int:
        return t.Offset(4 + 2 * slot)

    def tables(self, t, slot: int) -> list:
        o = self._field(t, slot)
        if not o:
            return []
        start = t.Vector(o)
        return [self.Table(t.Bytes, t.Indirect(start + 4 * i)) for i in range(t.VectorLen(o))]

    def table(self, t, slot: int):
        o = self._field(t, slot)
        return self.Table(t.Bytes, t.Indirect(o + t.Pos)) if o else None

    def u8_vector(self, t, slot: int) -> list[int]:
        o = self._field(t, slot)
        return [t.Get(self.N.Uint8Flags, t.Vector(o) + i) for i in range(t.VectorLen(o))] if o else []

    def u32_vector(self, t, slot: int) -> list[int]:
        o = self._field(t, slot)
        return [t.Get(self.N.Uint32Flags, t.Vector(o) + 4 * i) for i in range(t.VectorLen(o))] if o else []

    def u32(self, t, slot: int) -> int:
        o = self._field(t, slot)
        return t.Get(self.N.Uint32Flags, o + t.Pos) if o else 0

    def u8(self, t, slot: int) -> int:
        o = self._field(t, slot)
        return t.Get(self.N.Uint8Flags, o + t.Pos) if o else 0

    def string(self, t, slot: int) -> str:
        o = self._field(t, slot)
        return t.String(o + t.Pos).decode("utf-8", "replace") if o else ""


_CALLSITE, _FILELINE, _FUSED, _NAME, _OPAQUE = 1, 2, 3, 4, 5
# frames inside these packages are the framework's, not the model author's
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\](tensorflow|tf_keras|keras|jax|jaxlib|absl|flax)[/\\]")


class _Locations:
    """MLIR locations as the converter serialises them. An op's location is a FusedLoc of, per TensorFlow op
    fused into it, a NameLoc "Type:" followed by a CallSiteLoc(NameLoc "tf/op/name@function", the Python
    stack): a chain of CallSiteLocs over FileLineColLocs, outermost frame first (when the converter had the
    function's debug info: a tf.function, or a SavedModel saved with save_debug_info)."""

    def __init__(self, reader: _FB, kinds: list[int], attrs: list):
        self.r, self.kinds, self.attrs = reader, kinds, attrs

    def _loc(self, index: int):
        if not 0 <= index < len(self.attrs) or self.kinds[index] != 1:      # Attribute: 1 = Location
            return None, None
        loc = self.attrs[index]
        return self.r.u8(loc, 0), self.r.table(loc, 1)

    def _frames(self, index: int, depth: int = 0) -> list[str]:
        """A stack as "file:line" strings, outermost first."""
        kind, t = self._loc(index)
        if t is None or depth > 256:
            return []
        if kind == _FILELINE:
            return [f"{self.r.string(t, 0)}:{self.r.u32(t, 1)}"]
        if kind == _CALLSITE:
            return self._frames(self.r.u32(t, 0), depth + 1) + self._frames(self.r.u32(t, 1), depth + 1)
        return []

    def _items(self, index: int, depth: int = 0) -> list[dict]:
        kind, t = self._loc(index)
        if t is None or depth > 64:
            return []
        if kind == _NAME:
            name = self.r.string(t, 0)
            if name.endswith(":"):
                return [{"type": name[:-1]}]
            return [{"name": name.split("@", 1)[0], "frames": self._frames(self.r.u32(t, 1))}]
        if kind == _CALLSITE:
            items = self._items(self.r.u32(t, 0), depth + 1)
            frames = self._frames(self.r.u32(t, 1))
            for item in items:
                if "name" in item and frames and not item.get("called"):
                    item["frames"], item["called"] = frames, True
            return items
        if kind == _FUSED:
            items, kind_of = [], None
            for child in self.r.u32_vector(t, 0):
                for item in self._items(child, depth + 1):
                    if set(item) == {"type"}:
                        kind_of = item["type"]
                    else:
                        item.setdefault("type", kind_of)
                        items.append(item)
            return items
        if kind == _OPAQUE:
            return self._items(self.r.u32(t, 1), depth + 1)
        return []

    def describe(self, index: int) -> list[str]:
        """"tf/op/name (TfType) at file.py:line" per TensorFlow op (the innermost frame outside the framework)."""
        out = []
        for item in self._items(index):
            if item.get("type") == "Const":
                continue
            text = item["name"] + (f" ({item['type']})" if item.get("type") else "")
            own = [f for f in item.get("frames", []) if not _LIBRARY.search(f)]
            if own:
                text += f" at {own[-1]}"
            out.append(text)
        return out
