"""tiergate's in-container tensor dump: a model's intermediate tensors, run by the tier's own runtime.

Depends only on numpy and the runtime (onnxruntime, onnxruntime-gpu, ai-edge-litert or tflite-runtime);
it must never import tiergate. The host prepares the models (for ONNX it has already added
the intermediate tensors it wants as graph outputs); this script only runs each model one
sample at a time on the first --max-samples samples (along each input's sample axis: the archive's
`__tiergate_axes__`, as the harness reads it, else the leading one; a 0-d input is a constant fed whole)
and saves what it saw, one sample at a time (never the whole dump in memory: a 320x320 detector's tensors are
about 190 MB a sample). For each --model NAME=PATH it writes to the output folder:

  NAME.tK.npy one file per tensor (keys t0, t1, ...: tensor names may hold '/' or ':'), shape [samples, *tensor
              shape], written a sample at a time as the runtime makes it (a tensor whose shape changes per sample
              is dropped: not comparable)
  explain.json {"ok", "runtime", "versions", "machine", "error", "samples" (those dumped), "requested",
              "bytes_per_sample" (both models' tensors), "max_bytes", "peak_rss_bytes" (this process's), "models": {NAME: {"tensors": {key: name},
              "quant": {name: [scale, zero_point, dtype]} (TFLite quantized tensors), "outputs" [the model's
              outputs], "seconds", "error"}}}

--max-bytes B sizes the sample count: the first sample of every model is run once to measure its tensors, and
at most B // (bytes a sample) samples are dumped (at least one), so that a dump never outgrows the tier's memory
limit, which the host passes here.

onnxruntime: every graph output of the (host-modified) model, with the session's default
options (the optimization level a harness run uses, so fused integer kernels stay fused).
TFLite (ai-edge-litert, or tflite-runtime where that is the runtime): every tensor an op writes,
and the inputs, read with experimental_preserve_all_tensors=True, keyed by unique names (a name
held by several tensors, or none, becomes NAME#INDEX, as tiergate's loader names them); quantized
tensors are saved as their raw integers, with their scale and zero point in explain.json;
"ops" {name: [op index, op name]} says which op produced each tensor (-1: a model input), and
"graph" is the graph the interpreter built: {"ops": [{"index", "op", "inputs", "outputs" (tensor
indices), "fused" (the fused activation, where the runtime ships the TFLite schema)}], "names"
{index: name}, "inputs", "outputs", "delegated" (tensors a delegate's node writes)}; "overwritten"
{name: op} lists the inputs an op ran in place over (their values are gone; not saved).

Exit 0 when every model ran, 1 when a runtime refused one (explain.json still says which), 2 on
bad arguments.

Usage:
  python tiergate_explain.py --runtime onnxruntime --model candidate=C.onnx --model reference=R.onnx \
      --data D.npz --out DIR [--max-samples 32] [--max-bytes 2147483648] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time

import numpy as np

# harness_cpu.py: beside this script in a checkout, in the runtime image's harness folder inside a container
sys.path.append("/opt/tiergate/harness")
from harness_cpu import cpu_info  # noqa: E402
from harness_data import AXES_MEMBER, LABELS, take  # noqa: E402  (the harness's own reading of samples)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", required=True, choices=("onnxruntime", "onnxruntime-gpu", "tflite"))
    p.add_argument("--model", action="append", required=True, help="NAME=PATH (repeatable)")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-samples", type=int, default=32)
    p.add_argument("--max-bytes", type=int, default=0, help="size the sample count so that the dump holds at most "
                   "this many bytes (0: no limit)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def one_line(exc) -> str:
    text = " ".join(str(exc).split())
    return (text or type(exc).__name__)[:600]




def load_data(path, limit):
    """({input: array}, {input: sample axis}, sample count): the axes from the archive's AXES_MEMBER (tiergate's
    JSON, as the harness reads it), else the leading axis; a 0-d array is a constant, fed whole to every sample."""
    with np.load(path, allow_pickle=False) as npz:
        data = {name: npz[name] for name in npz.files if name not in (LABELS, AXES_MEMBER)}
        meta = json.loads(str(npz[AXES_MEMBER][()])) if AXES_MEMBER in npz.files else {}
    axes = {name: meta.get("inputs", {}).get(name, 0 if a.ndim else None) for name, a in data.items()}
    sizes = [a.shape[axes[name]] for name, a in data.items() if axes[name] is not None]
    n = min([min(sizes), limit] if sizes else [1, limit])
    return {name: take(a, axes[name], 0, n) for name, a in data.items()}, axes, n


def sample(data, axes, name, s):
    return take(data[name], axes[name], s, s + 1)


def run_onnx(args, path, data, entry, n):
    """The model's graph outputs, a sample at a time: yields (names, values) per sample."""
    import onnxruntime as ort

    if args.runtime == "onnxruntime-gpu" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    providers = ["CPUExecutionProvider"]
    if args.runtime == "onnxruntime-gpu":
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(path, sess_options=opts, providers=providers)
    names = [o.name for o in session.get_outputs()]
    inputs = [i.name for i in session.get_inputs()]
    missing = [n for n in inputs if n not in data]
    if missing:
        raise ValueError(f"the data has no array named {missing[0]!r} (model input)")
    entry["versions"] = {"onnxruntime": ort.__version__}
    entry["outputs"] = names
    for s in range(n):
        outs = session.run(names, {name: sample(data, args.axes, name, s) for name in inputs})
        yield names, [np.asarray(value) for value in outs]


def _litert():
    """The TFLite interpreter module and its version: ai-edge-litert (the runtime images) or tflite-runtime."""
    try:
        import ai_edge_litert
        from ai_edge_litert import interpreter

        return interpreter, {"ai-edge-litert": getattr(ai_edge_litert, "__version__", "")}
    except ImportError:
        import tflite_runtime
        from tflite_runtime import interpreter

        return interpreter, {"tflite-runtime": getattr(tflite_runtime, "__version__", "")}


def unique_names(details):
    """{tensor index: name}: a name held by several tensors, or none, becomes NAME#INDEX (tiergate's loader
    names the file's tensors the same way, so the host pairs by these keys)."""
    counts = {}
    for d in details:
        counts[d["name"]] = counts.get(d["name"], 0) + 1
    return {int(d["index"]): d["name"] if d["name"] and counts[d["name"]] == 1 else f"{d['name']}#{int(d['index'])}"
            for d in details}


def fused_activations(path):
    """{op index: fused activation name} read from the file, where the runtime ships the TFLite schema
    (ai-edge-litert does; tflite-runtime does not: then {})."""
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:
        return {}
    with open(path, "rb") as fh:
        graph = schema.Model.GetRootAs(fh.read(), 0).Subgraphs(0)
    names = {v: k for k, v in vars(schema.ActivationFunctionType).items() if not k.startswith("_")}
    found = {}
    for i in range(graph.OperatorsLength()):
        options = schema.OperatorT.InitFromObj(graph.Operators(i)).builtinOptions
        value = getattr(options, "fusedActivationFunction", None)
        if value is not None:
            found[i] = names.get(value, str(value))
    return found


def _quantization(d):
    """(scales, zero points, axis) of a tensor's details, per-channel included."""
    params = d.get("quantization_parameters") or {}
    scales = [float(x) for x in np.asarray(params.get("scales", [])).ravel()]
    zeros = [int(x) for x in np.asarray(params.get("zero_points", [])).ravel()]
    if not scales:
        scale, zero = d.get("quantization", (0.0, 0))
        scales, zeros = ([float(scale)], [int(zero)]) if scale else ([], [])
    return scales, zeros or [0] * len(scales), int(params.get("quantized_dimension", 0))


IN_PLACE = ("ADD", "SUB", "MUL", "DIV")


def overwritten(graph_ops, names, collected):
    """{tensor: op} for the inputs an op wrote its output over (held bitwise what that op wrote, in every
    sample): tflite-runtime 2.14 runs ADD in place even with experimental_preserve_all_tensors (measured; LiteRT
    2.3 does not). Their values are gone, so they are not saved."""
    found = {}
    for op in graph_ops:
        if op["op"] not in IN_PLACE or not op["outputs"]:
            continue
        out = collected.get(names.get(op["outputs"][0]), [])
        for t in op["inputs"]:
            values = collected.get(names.get(t), [])
            if (t not in op["outputs"] and values and len(values) == len(out)
                    and all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(values, out))):
                found[names[t]] = op["op"]
    return found


def run_tflite(args, path, data, entry, n):
    """Every tensor an op writes (and the inputs), a sample at a time: yields (names, values) per sample; the
    inputs an op wrote over in place in every sample end in entry["overwritten"]."""
    module, versions = _litert()
    interp = module.Interpreter(model_path=path, num_threads=args.threads, experimental_preserve_all_tensors=True)
    interp.allocate_tensors()
    inputs = interp.get_input_details()
    missing = [i["name"] for i in inputs if i["name"] not in data]
    if missing:
        raise ValueError(f"the data has no array named {missing[0]!r} (model input)")
    all_details = interp.get_tensor_details()
    names = unique_names(all_details)
    # the graph the interpreter built: the file's ops in order, then the delegate's nodes (with
    # experimental_preserve_all_tensors, LiteRT's XNNPACK takes one op per node, so every tensor is written)
    fused = fused_activations(path)
    graph_ops, delegated, ops = [], [], {}
    for op in interp._get_ops_details():
        item = {"index": int(op["index"]), "op": op["op_name"], "inputs": [int(t) for t in op["inputs"]],
                "outputs": [int(t) for t in op["outputs"]]}
        if op["op_name"] == "DELEGATE":
            delegated += item["outputs"]
            continue
        if item["index"] in fused:
            item["fused"] = fused[item["index"]]
        graph_ops.append(item)
        for t in item["outputs"]:
            ops.setdefault(t, (item["index"], item["op"]))
    for i in inputs:
        ops.setdefault(int(i["index"]), (-1, "input"))
    entry["graph"] = {"ops": graph_ops, "names": {str(k): v for k, v in names.items()},
                      "inputs": [int(i["index"]) for i in inputs],
                      "outputs": [int(o["index"]) for o in interp.get_output_details()],
                      "delegated": sorted(set(delegated))}
    # the tensors ops produce (and the inputs): what a layer computed, not its constant weights
    details = [d for d in all_details if int(d["index"]) in ops]
    entry["ops"] = {names[int(d["index"])]: list(ops[int(d["index"])]) for d in details}
    quant = {}
    for d in details:
        scales, zeros, _ = _quantization(d)
        if len(scales) == 1 and scales[0] and np.issubdtype(d["dtype"], np.integer):
            quant[names[int(d["index"])]] = [scales[0], zeros[0], np.dtype(d["dtype"]).name]
    entry["versions"] = versions
    entry["outputs"] = [names[int(o["index"])] for o in interp.get_output_details()]
    entry["quant"] = quant
    written = None             # the inputs an op wrote over in every sample so far
    for s in range(n):
        for i in inputs:
            value = sample(data, args.axes, i["name"], s)
            key = names[int(i["index"])]
            if key in quant and np.issubdtype(value.dtype, np.floating):
                scale, zero, dtype = quant[key]
                info = np.iinfo(dtype)
                value = np.clip(np.round(value / scale + zero), info.min, info.max).astype(dtype)
            interp.set_tensor(i["index"], value.astype(i["dtype"]))
        interp.invoke()
        seen = {}
        for d in details:
            try:
                seen[names[int(d["index"])]] = np.array(interp.get_tensor(d["index"]))
            except ValueError:      # a tensor with no data (e.g. an unused optional input)
                continue
        now = overwritten(graph_ops, names, {name: [value] for name, value in seen.items()})
        written = now if written is None else {k: v for k, v in written.items() if now.get(k) == v}
        entry["overwritten"] = written
        yield list(seen), list(seen.values())


class Sink:
    """One model's tensors streamed to NAME.tK.npy, a sample at a time: the header is written with the sample
    count on the first sample, each later sample appended; a tensor whose shape or type changes, or that a sample
    lacks, is dropped (its file removed)."""

    def __init__(self, out, name, n):
        self.out, self.name, self.n = out, name, n
        self.keys, self.files, self.specs, self.count = {}, {}, {}, 0

    def path(self, key):
        return os.path.join(self.out, f"{self.name}.{key}.npy")

    def add(self, names, values):
        seen = set()
        for tensor, value in zip(names, values):
            key = self.keys.setdefault(tensor, f"t{len(self.keys)}")
            spec = (value.shape, value.dtype.str)
            if self.count == 0:
                fh = open(self.path(key), "wb")
                np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(value.dtype),
                                                          "fortran_order": False, "shape": (self.n, *value.shape)})
                self.files[key], self.specs[key] = fh, spec
            elif key not in self.files:
                continue
            elif self.specs[key] != spec:
                self.drop(key)
                continue
            self.files[key].write(np.ascontiguousarray(value).tobytes())
            seen.add(key)
        for key in [k for k in self.files if k not in seen]:
            self.drop(key)
        self.count += 1

    def drop(self, key):
        fh = self.files.pop(key, None)
        if fh is not None:
            fh.close()
            os.remove(self.path(key))

    def close(self, skip=()):
        """{key: tensor} of the tensors written whole; `skip`: tensors not to keep (their files removed)."""
        for tensor in skip:
            if tensor in self.keys:
                self.drop(self.keys[tensor])
        for fh in self.files.values():
            fh.close()
        return {key: tensor for tensor, key in self.keys.items() if key in self.files}


def first_sample_bytes(args, runner, path, data):
    """The bytes of one sample's tensors of a model (its first sample, run once to measure)."""
    scratch = {"error": ""}
    return sum(int(v.nbytes) for _, values in runner(args, path, data, scratch, 1) for v in values)


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    doc = {"ok": True, "runtime": args.runtime, "machine": platform.machine(), "cpu": cpu_info(), "error": "",
           "models": {}}
    data, args.axes, n = load_data(args.data, args.max_samples)
    runner = run_tflite if args.runtime == "tflite" else run_onnx
    specs = [spec.partition("=")[::2] for spec in args.model]
    doc.update(requested=n, samples=n, max_bytes=args.max_bytes)
    code = 0
    if args.max_bytes > 0:
        try:
            per_sample = sum(first_sample_bytes(args, runner, path, data) for _, path in specs)
        except Exception:  # noqa: BLE001 - the runtime's refusal: said below, model by model
            per_sample = 0
        doc["bytes_per_sample"] = per_sample
        if per_sample:
            doc["samples"] = n = max(1, min(n, args.max_bytes // per_sample))
    for name, path in specs:
        entry = doc["models"].setdefault(name, {"error": ""})
        t0 = time.monotonic()
        sink = Sink(args.out, name, n)
        try:
            for names, values in runner(args, path, data, entry, n):
                sink.add(names, values)
        except Exception as exc:  # noqa: BLE001 - the runtime's refusal, in its own words
            sink.close(skip=list(sink.keys))
            doc["ok"], entry["error"], code = False, one_line(exc), 1
            doc["error"] = doc["error"] or f"{name}: {entry['error']}"
            continue
        keys = sink.close(skip=entry.get("overwritten") or {})
        quant = {k: v for k, v in (entry.pop("quant", None) or {}).items() if k in keys.values()}
        entry.update(tensors=keys, quant=quant, seconds=round(time.monotonic() - t0, 3))
    doc["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: KiB
    path = os.path.join(args.out, "explain.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh)
    os.replace(path + ".tmp", path)
    if code:
        print(f"explain: {doc['error']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
