"""tiergate's in-container tensor dump: a model's intermediate tensors, run by the tier's own runtime.

Depends only on numpy and the runtime (onnxruntime, onnxruntime-gpu or ai-edge-litert);
it must never import tiergate. The host prepares the models (for ONNX it has already added
the intermediate tensors it wants as graph outputs); this script only runs each model one
sample at a time on the first --max-samples samples and saves what it saw. For each
--model NAME=PATH it writes to the output folder:

  NAME.npz    one array per tensor, keyed t0, t1, ... (tensor names may hold '/' or ':'),
              shape [samples, *tensor shape]
  explain.json {"ok", "runtime", "versions", "machine", "error", "models": {NAME: {"tensors":
              {key: name}, "quant": {name: [scale, zero_point, dtype]} (TFLite quantized tensors),
              "outputs" [the model's outputs], "seconds", "error"}}}

onnxruntime: every graph output of the (host-modified) model, with the session's default
options (the optimization level a harness run uses, so fused integer kernels stay fused).
TFLite: every tensor of the model, read with experimental_preserve_all_tensors=True; quantized
tensors are saved as their raw integers, with their scale and zero point in explain.json, and
"ops" {name: [op index, op name]} says which op produced each tensor (-1: a model input).

Exit 0 when every model ran, 1 when a runtime refused one (explain.json still says which), 2 on
bad arguments.

Usage:
  python tiergate_explain.py --runtime onnxruntime --model candidate=C.onnx --model reference=R.onnx \
      --data D.npz --out DIR [--max-samples 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

# harness_cpu.py: beside this script in a checkout, in the runtime image's harness folder inside a container
sys.path.append("/opt/tiergate/harness")
from harness_cpu import cpu_info  # noqa: E402

LABELS = "labels"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", required=True, choices=("onnxruntime", "onnxruntime-gpu", "tflite"))
    p.add_argument("--model", action="append", required=True, help="NAME=PATH (repeatable)")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-samples", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def one_line(exc) -> str:
    text = " ".join(str(exc).split())
    return (text or type(exc).__name__)[:600]


def load_data(path, limit):
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name][:limit] for name in npz.files if name != LABELS}


def run_onnx(args, path, data, entry):
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
    n = len(data[inputs[0]])
    collected = [[] for _ in names]
    for s in range(n):
        outs = session.run(names, {name: data[name][s:s + 1] for name in inputs})
        for store, value in zip(collected, outs):
            store.append(np.asarray(value))
    entry["versions"] = {"onnxruntime": ort.__version__}
    entry["outputs"] = names
    return names, collected, {}


def run_tflite(args, path, data, entry):
    import ai_edge_litert
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path, num_threads=args.threads, experimental_preserve_all_tensors=True)
    interp.allocate_tensors()
    inputs = interp.get_input_details()
    missing = [i["name"] for i in inputs if i["name"] not in data]
    if missing:
        raise ValueError(f"the data has no array named {missing[0]!r} (model input)")
    # the tensors ops produce (and the inputs): what a layer computed, not its constant weights
    ops = {}
    for op in interp._get_ops_details():
        for t in op["outputs"]:
            ops.setdefault(int(t), (int(op["index"]), op["op_name"]))
    for i in inputs:
        ops.setdefault(int(i["index"]), (-1, "input"))
    details = [d for d in interp.get_tensor_details() if d.get("name") and int(d["index"]) in ops]
    entry["ops"] = {d["name"]: list(ops[int(d["index"])]) for d in details}
    names, quant = [], {}
    for d in details:
        scale, zero = d.get("quantization", (0.0, 0))
        if scale and np.issubdtype(d["dtype"], np.integer):
            quant[d["name"]] = [float(scale), int(zero), np.dtype(d["dtype"]).name]
    n = len(data[inputs[0]["name"]])
    collected = {}
    for s in range(n):
        for i in inputs:
            value = data[i["name"]][s:s + 1]
            if i["name"] in quant and np.issubdtype(value.dtype, np.floating):
                scale, zero, dtype = quant[i["name"]]
                info = np.iinfo(dtype)
                value = np.clip(np.round(value / scale + zero), info.min, info.max).astype(dtype)
            interp.set_tensor(i["index"], value.astype(i["dtype"]))
        interp.invoke()
        for d in details:
            try:
                value = interp.get_tensor(d["index"])
            except ValueError:      # a tensor with no data (e.g. an unused optional input)
                continue
            collected.setdefault(d["name"], []).append(np.array(value))
    names = [name for name, values in collected.items() if len(values) == n]
    entry["versions"] = {"ai-edge-litert": getattr(ai_edge_litert, "__version__", "")}
    entry["outputs"] = [o["name"] for o in interp.get_output_details()]
    return names, [collected[name] for name in names], {k: v for k, v in quant.items() if k in names}


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    doc = {"ok": True, "runtime": args.runtime, "machine": platform.machine(), "cpu": cpu_info(), "error": "", "models": {}}
    data = load_data(args.data, args.max_samples)
    code = 0
    for spec in args.model:
        name, _, path = spec.partition("=")
        entry = doc["models"].setdefault(name, {"error": ""})
        t0 = time.monotonic()
        try:
            runner = run_tflite if args.runtime == "tflite" else run_onnx
            names, collected, quant = runner(args, path, data, entry)
        except Exception as exc:  # noqa: BLE001 - the runtime's refusal, in its own words
            doc["ok"], entry["error"], code = False, one_line(exc), 1
            doc["error"] = doc["error"] or f"{name}: {entry['error']}"
            continue
        arrays, keys = {}, {}
        for k, (tensor, values) in enumerate(zip(names, collected)):
            shapes = {v.shape for v in values}
            if len(shapes) != 1:        # a tensor whose shape changes per sample: not comparable
                continue
            keys[f"t{k}"] = tensor
            arrays[f"t{k}"] = np.stack(values)
        np.savez(os.path.join(args.out, f"{name}.npz"), **arrays)
        entry.update(tensors=keys, quant=quant, seconds=round(time.monotonic() - t0, 3))
    path = os.path.join(args.out, "explain.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh)
    os.replace(path + ".tmp", path)
    if code:
        print(f"explain: {doc['error']}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
