"""tiergate's TVM compile step, run in the compiler image (containers/tvm/compiler.Dockerfile).

Depends only on tvm, onnx and numpy; it must never import tiergate. It reads one ONNX model, makes it static
(every input's shape as given by --shape, the batch filled in by the host from the device class; shape
computations folded to constants: floating-point nodes are never folded, so what the compiler's passes do stays
theirs to record), imports it with Relax's ONNX frontend, compiles it for the class's target at its opt level
with its disabled passes, recording each pass applied (its name and the structural hash of the module after it),
and exports the library for the target's architecture (a cross linker for aarch64). It writes to --out:

  model.so         the compiled library (relax VM executable), loaded by the harness's TvmRunner
  tvm-meta.json    {"schema", "tvm_version", "target", "opt_level", "disabled_passes", "inputs" and "outputs"
                   ([{"name", "shape", "dtype"}], the ONNX model's names, in its order), "passes" ([{"name",
                   "fingerprint"}] in the order applied), "static_seconds", "import_seconds", "compile_seconds"
                   (tvm.compile: the passes and lowering), "export_seconds" (export_library: LLVM emits the
                   object code here, then the link), "total_seconds", "folded" (shape
                   computations folded), "library", "kernels" (the lowered graph: one entry per kernel main
                   calls, see kernel_graph), "kernels_after" (the pass whose module they were read from)}
  error.json       instead, when the model cannot be compiled: {"error": one line, "stage": "static" | "import" |
                   "compile" | "export"}; exit 1

Usage:
  python tiergate_tvm_compile.py --model M.onnx --out DIR --target '{"kind": "llvm", "mcpu": "haswell"}'
      [--opt-level 3] [--disable-pass NAME ...] [--shape NAME=1,3,48,192 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

LIBRARY, META, ERROR = "model.so", "tvm-meta.json", "error.json"
SCHEMA = 1
CROSS_LINKERS = {"aarch64": "aarch64-linux-gnu-gcc"}       # target mtriple's architecture -> linker in the image
FOLDABLE = {"Shape", "Gather", "Concat", "Unsqueeze", "Squeeze", "Cast", "Slice", "Mul", "Add", "Sub", "Div",
            "Reshape", "Equal", "Where", "Range", "ReduceProd", "Identity", "Constant", "ConstantOfShape", "Neg",
            "Floor", "Ceil", "Max", "Min", "Expand", "Size", "Not", "Less", "Greater"}
MAX_FOLDED = 4096          # elements: a folded value is a shape or an index, never a tensor of data


class Refused(Exception):
    """The model cannot be compiled: the message is one line for the user."""

    def __init__(self, stage, message):
        super().__init__(message)
        self.stage = stage


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--target", required=True, help="the TVM target as a JSON object")
    p.add_argument("--opt-level", type=int, default=3)
    p.add_argument("--disable-pass", action="append", default=[], dest="disabled")
    p.add_argument("--shape", action="append", default=[], help="NAME=D0,D1,... an input's static shape")
    return p.parse_args(argv)


def parse_shapes(items):
    shapes = {}
    for item in items:
        name, _, dims = item.rpartition("=")
        shapes[name] = [int(d) for d in dims.split(",") if d != ""]
    return shapes


# --- the model made static ------------------------------------------------------------------------------------


def static_model(model, shapes):
    """A copy of `model` with every input's shape set from `shapes` and its shape computations folded."""
    import onnx
    from onnx import numpy_helper, shape_inference

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    for value in graph.input:
        if value.name in inits:
            continue
        dims = value.type.tensor_type.shape.dim
        given = shapes.get(value.name)
        if given is None:
            if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
                continue
            raise Refused("static", f"input {value.name!r} has a shape that is not static "
                                    f"({_dims_text(dims)}) and none was given")
        if len(given) != len(dims):
            raise Refused("static", f"input {value.name!r} has {len(dims)} dimensions, its given shape {given} "
                                    f"has {len(given)}")
        for dim, size in zip(dims, given):
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                raise Refused("static", f"input {value.name!r} is {_dims_text(dims)}: the given shape {given} "
                                        f"does not fit it")
            dim.Clear()
            dim.dim_value = size
    for value in graph.output:            # declared output shapes (symbolic batch) give way to inferred ones
        value.type.tensor_type.ClearField("shape")
    folded = 0
    for _ in range(64):                                   # until nothing more folds
        model = shape_inference.infer_shapes(model, data_prop=True)
        graph = model.graph
        known = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        static = _static_shapes(graph)
        changed = False
        for node in list(graph.node):
            value = _fold(node, known, static)
            if value is None:
                continue
            graph.node.remove(node)
            graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
            known[node.output[0]] = value
            folded += 1
            changed = True
        if not changed:
            break
    _drop_unused(graph)
    return shape_inference.infer_shapes(model, data_prop=True), folded


def _dims_text(dims):
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims) + "]"


def _static_shapes(graph):
    out = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0
                                                            for d in dims):
            out[value.name] = tuple(d.dim_value for d in dims)
    return out


def _fold(node, known, shapes):
    """The node's single output as a constant (integer shape arithmetic only), or None."""
    if node.op_type not in FOLDABLE or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return None
    if node.op_type == "Shape":
        shape = shapes.get(node.input[0])
        if shape is None or any(a.name in ("start", "end") for a in node.attribute):
            return None
        return np.array(shape, np.int64)
    if node.op_type == "Size":
        shape = shapes.get(node.input[0])
        return None if shape is None else np.array(int(np.prod(shape)), np.int64)
    inputs = [name for name in node.input if name]
    if any(name not in known for name in inputs) or any(known[name].size > MAX_FOLDED for name in inputs):
        return None
    if node.op_type != "Cast" and any(not np.issubdtype(known[name].dtype, np.integer)
                                      and known[name].dtype != np.bool_ for name in inputs):
        return None
    value = _evaluate(node, {name: known[name] for name in inputs})
    if value is None or value.size > MAX_FOLDED or not (np.issubdtype(value.dtype, np.integer)
                                                        or value.dtype == np.bool_):
        return None
    return value


def _evaluate(node, feeds):
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in feeds.items()]
    graph = helper.make_graph([node], "fold", inputs, [helper.make_tensor_value_info(node.output[0], 0, None)])
    try:
        (value,) = ReferenceEvaluator(helper.make_model(graph)).run(None, feeds)
    except Exception:  # noqa: BLE001 - a node the evaluator cannot run stays in the graph
        return None
    return np.asarray(value)


def _drop_unused(graph):
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
            for attr in node.attribute:           # subgraphs read outer names
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    needed.update(i for n in sub.node for i in n.input if i)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    for t in [t for t in graph.initializer if t.name not in needed]:
        graph.initializer.remove(t)


def tensors(values, initializers=()):
    """[{"name", "shape", "dtype"}] of graph inputs or outputs (initializers listed as inputs left out)."""
    from onnx import helper

    out = []
    for value in values:
        if value.name in initializers:
            continue
        kind = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in kind.shape.dim]
        out.append({"name": value.name, "shape": shape,
                    "dtype": np.dtype(helper.tensor_dtype_to_np_dtype(kind.elem_type)).name})
    return out


# --- the compile ----------------------------------------------------------------------------------------------


def compile_model(args):
    import onnx

    shapes = parse_shapes(args.shape)
    try:
        source = onnx.load(args.model)
    except Exception as exc:  # noqa: BLE001
        raise Refused("static", f"not a readable ONNX model: {one_line(exc)}") from None
    t0 = time.monotonic()
    try:
        model, folded = static_model(source, shapes)
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - onnx's shape inference refusing the model
        raise Refused("static", f"making the model static failed: {one_line(exc)}") from None
    static_s = time.monotonic() - t0
    inits = {t.name for t in model.graph.initializer}
    inputs, outputs = tensors(model.graph.input, inits), tensors(model.graph.output)
    for t in inputs:
        if any(d <= 0 for d in t["shape"]):
            raise Refused("static", f"{t['name']!r} has no static shape after folding ({t['shape']})")

    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    t0 = time.monotonic()
    try:
        mod = from_onnx(model, shape_dict={t["name"]: t["shape"] for t in inputs}, keep_params_in_input=False)
    except Exception as exc:  # noqa: BLE001 - an op the frontend does not import, in TVM's words
        raise Refused("import", f"TVM's ONNX frontend cannot import the model: {one_line(exc)}") from None
    import_s = time.monotonic() - t0
    passes = []
    lowered = {"pipeline": True}          # the module after the last graph-level pass of the pipeline

    @tvm.instrument.pass_instrument
    class Record:
        def run_after_pass(self, mod, info):
            # free variables mapped by position, not by address: the same module hashes the same in every process
            # (MakePackedAPI leaves free handles that a plain structural hash takes by address)
            fingerprint = tvm_ffi.structural_hash(mod, map_free_vars=True) & (2**64 - 1)
            passes.append({"name": info.name, "fingerprint": f"{fingerprint:016x}"})
            if lowered["pipeline"] and info.name in GRAPH_PASSES:
                lowered.update(mod=mod, after=info.name)

    target_doc = json.loads(args.target)
    t0 = time.monotonic()
    try:
        target = tvm.target.Target(target_doc)
        with tvm.transform.PassContext(opt_level=args.opt_level, instruments=[Record()],
                                       disabled_pass=list(args.disabled)):
            pipelined = relax.get_pipeline("zero")(mod)
            lowered["pipeline"] = False
            executable = tvm.compile(pipelined, target=target)
    except Exception as exc:  # noqa: BLE001
        raise Refused("compile", f"TVM cannot compile the model for {json.dumps(target_doc, sort_keys=True)}: "
                                 f"{one_line(exc)}") from None
    compile_s = time.monotonic() - t0
    try:
        kernels = kernel_graph(lowered["mod"]) if "mod" in lowered else []
    except Exception:  # noqa: BLE001 - the record is for lint; a TVM whose IR reads otherwise still compiles
        kernels = []
    t0 = time.monotonic()
    library = os.path.join(args.out, LIBRARY)
    arch = str(target_doc.get("mtriple", "")).split("-")[0]
    try:
        if arch in CROSS_LINKERS:
            try:
                from tvm.support import cc          # TVM 0.2x
            except ImportError:
                from tvm.contrib import cc          # older TVM

            executable.export_library(library, fcompile=cc.cross_compiler(CROSS_LINKERS[arch]))
        else:
            executable.export_library(library)
    except Exception as exc:  # noqa: BLE001
        raise Refused("export", f"exporting the library failed: {one_line(exc)}") from None
    return {"schema": SCHEMA, "tvm_version": tvm.__version__, "target": target_doc, "target_text": str(target),
            "opt_level": args.opt_level, "disabled_passes": sorted(args.disabled), "pipeline": "zero",
            "inputs": inputs, "outputs": outputs, "passes": passes, "library": LIBRARY, "folded": folded,
            "kernels": kernels, "kernels_after": lowered.get("after", ""),
            "static_seconds": round(static_s, 3), "import_seconds": round(import_s, 3),
            "compile_seconds": round(compile_s, 3), "export_seconds": round(time.monotonic() - t0, 3)}


# --- the lowered graph ----------------------------------------------------------------------------------------

# the pipeline's graph-level passes: the module after the last of them that ran shows each kernel with the operators
# in it (after FuseOps a fused function calls one PrimFunc per operator; FuseTIR merges them into one body)
GRAPH_PASSES = ("LegalizeOps", "AnnotateTIROpPattern", "FoldConstant", "FuseOps")


def kernel_graph(mod):
    """The kernels `main` calls, in order: [{"name": the value's name, "kernel": the function called, "ops":
    [[operator, TVM op pattern (0 elementwise .. 4 out-elementwise-fusable, 8 opaque; -1 unknown), [input dtypes]]],
    "inputs": [names of the graph values it reads ("" for constants)], "dtype": what it writes}]. A value that only
    picks a tuple's field is its source (a kernel's name); other bindings are left out."""
    from tvm import ir, relax

    alias = {}
    kernels = []

    def name_of(var):
        name = getattr(var, "name_hint", None)
        if not isinstance(name, str):
            name = getattr(var, "name", None)
        name = name if isinstance(name, str) else ""
        return alias.get(name, name)

    def dtype_of(expr):
        for attr in ("struct_info", "ty", "checked_type"):
            try:
                return str(getattr(expr, attr).dtype)
            except Exception:  # noqa: BLE001 - another TVM version's accessor, or no dtype (a tuple)
                continue
        try:
            return str(expr.data.dtype)
        except Exception:  # noqa: BLE001
            return ""

    def inputs_of(args):
        return [name_of(a) if isinstance(a, relax.Var) else "" for a in args]

    def pattern(gv):
        attrs = mod[gv].attrs
        try:
            return int(attrs["op_pattern"]) if attrs is not None and "op_pattern" in attrs else -1
        except Exception:  # noqa: BLE001
            return -1

    def bindings(func):
        for block in func.body.blocks:
            yield from block.bindings

    def call_tir(value):
        return (isinstance(value, relax.Call) and isinstance(value.op, ir.Op) and value.op.name == "relax.call_tir")

    for binding in bindings(mod["main"]):
        value, name = binding.value, name_of(binding.var)
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            alias[name] = name_of(value.tuple_value)
            continue
        if call_tir(value):
            gv = value.args[0]
            ops = [[op_name(gv.name_hint), pattern(gv), [dtype_of(a) for a in value.args[1].fields]]]
            kernels.append({"name": name, "kernel": gv.name_hint, "ops": ops,
                            "inputs": inputs_of(value.args[1].fields), "dtype": dtype_of(binding.var)})
        elif isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and \
                isinstance(mod[value.op], relax.Function):
            ops = [[op_name(inner.value.args[0].name_hint), pattern(inner.value.args[0]),
                    [dtype_of(a) for a in inner.value.args[1].fields]]
                   for inner in bindings(mod[value.op]) if call_tir(inner.value)]
            kernels.append({"name": name, "kernel": value.op.name_hint, "ops": ops, "inputs": inputs_of(value.args),
                            "dtype": dtype_of(binding.var)})
    return kernels


def op_name(function_name):
    """The operator a legalized PrimFunc computes: its name less the number that tells duplicates apart
    ("quantize1" -> "quantize"; "conv2d" stays)."""
    base = function_name.rstrip("0123456789")
    return function_name if not base or base.endswith(("conv", "_")) else base


def one_line(exc):
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[-1] if lines else type(exc).__name__    # TVM's messages end with the reason, after a trace
    return " ".join(text.split())[:600]


def write_json(path, doc):
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh)
    os.replace(path + ".tmp", path)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.monotonic()
    try:
        meta = compile_model(args)
    except Refused as exc:
        write_json(os.path.join(args.out, ERROR), {"error": str(exc), "stage": exc.stage})
        print(f"tvm compile: {exc}", file=sys.stderr)
        return 1
    meta["total_seconds"] = round(time.monotonic() - t0, 3)
    write_json(os.path.join(args.out, META), meta)
    print(f"tvm compile: {len(meta['passes'])} passes, {meta['compile_seconds']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
