"""tiergate's in-container harness: run one artifact over one evaluation set.

Depends only on numpy and the runtime (onnxruntime, onnxruntime-gpu or
ai-edge-litert); it must never import tiergate. It loads the artifact, warms
up, runs the evaluation inputs in batches, times each inference call with a
monotonic nanosecond clock and writes to the output folder:

  outputs.npz   one array per model output (first axis = sample)
  result.json   what it can know: machine, runtime versions, threads, batch size,
                n_samples, warmup, latencies_ns (one per inference call), extra

Usage:
  python tiergate_harness.py --runtime onnxruntime --model M.onnx --data D.npz --out DIR
      [--threads 1] [--batch-size 1] [--warmup 3] [--compare-rounds 0]

--compare-rounds N (bench/bench_harness.py) alternates, in this process, N rounds
of the harness's timed loop and of a bare `session.run` / `invoke` loop, and
records each round's medians in extra.compare: the harness's own overhead.

Quantized TFLite inputs are quantized from float data with the input's scale and
zero point; quantized outputs are dequantized to float32 (listed in
extra.dequantized_outputs), so every result compares with the FP32 reference.

Test-only fault injection (documented in docs/execution.md): the environment
variable TIERGATE_HARNESS_FAULT=segv makes the process die of a real SIGSEGV
after the model is loaded; TIERGATE_HARNESS_FAULT=hang makes it sleep forever.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import os
import platform
import sys
import time

import numpy as np

LABELS = "labels"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", required=True, choices=("onnxruntime", "onnxruntime-gpu", "tflite"))
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compare-rounds", type=int, default=0)
    return p.parse_args(argv)


def load_data(path):
    with np.load(path, allow_pickle=False) as npz:
        data = {name: npz[name] for name in npz.files if name != LABELS}
    if not data:
        raise SystemExit(f"harness: {path}: no input arrays")
    sizes = {len(a) for a in data.values()}
    if len(sizes) != 1:
        raise SystemExit(f"harness: {path}: inputs differ in sample count {sorted(sizes)}")
    return data, sizes.pop()


def batch_for(dim0, wanted):
    """A fixed leading dimension decides the batch; a symbolic one takes the device class's."""
    return dim0 if isinstance(dim0, int) and dim0 > 0 else wanted


def slices(n, batch):
    return [(start, min(start + batch, n)) for start in range(0, n, batch)]


def inject_fault():
    fault = os.environ.get("TIERGATE_HARNESS_FAULT", "")
    if fault == "segv":
        sys.stderr.write("harness: TIERGATE_HARNESS_FAULT=segv: reading address 0\n")
        sys.stderr.flush()
        ctypes.string_at(0)
    elif fault == "hang":
        sys.stderr.write("harness: TIERGATE_HARNESS_FAULT=hang: sleeping\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)


# --- onnxruntime ----------------------------------------------------------------------


class OnnxRunner:
    def __init__(self, args):
        import onnxruntime as ort

        if args.runtime == "onnxruntime-gpu" and hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* wheels, when installed
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        providers = ["CPUExecutionProvider"]
        if args.runtime == "onnxruntime-gpu":
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        self.session = ort.InferenceSession(args.model, sess_options=opts, providers=providers)
        if args.runtime == "onnxruntime-gpu" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise SystemExit("harness: onnxruntime-gpu: the CUDA execution provider is not available")
        self.inputs = self.session.get_inputs()
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.versions = {"onnxruntime": ort.__version__}
        self.extra = {"providers": self.session.get_providers()}

    def batch_size(self, wanted):
        return min(batch_for(i.shape[0] if i.shape else None, wanted) for i in self.inputs)

    def prepare(self, data, start, stop):
        feed = {}
        for i in self.inputs:
            if i.name not in data:
                raise SystemExit(f"harness: the data has no array named {i.name!r} (model input)")
            feed[i.name] = data[i.name][start:stop]
        return feed

    def infer(self, feed):
        return self.session.run(self.output_names, feed)

    def timed_loop(self, feeds, store):
        run, names, clock = self.session.run, self.output_names, time.monotonic_ns
        lat = []
        for i, feed in enumerate(feeds):
            t0 = clock()
            out = run(names, feed)
            lat.append(clock() - t0)
            store(i, out)
            del out  # freed before the next call, as in a bare loop
        return lat


# --- LiteRT (TFLite) ------------------------------------------------------------------


class TfliteRunner:
    def __init__(self, args):
        import ai_edge_litert
        from ai_edge_litert.interpreter import Interpreter

        self.interp = Interpreter(model_path=args.model, num_threads=args.threads)
        self.interp.allocate_tensors()
        self.inputs = self.interp.get_input_details()
        self.outputs = self.interp.get_output_details()
        self.output_names = [o["name"] for o in self.outputs]
        self.versions = {"ai-edge-litert": getattr(ai_edge_litert, "__version__", "")}
        self.extra = {"dequantized_outputs": [o["name"] for o in self.outputs if _quantized(o)]}
        self.current = None

    def batch_size(self, wanted):
        return min(batch_for(-1 if i["shape_signature"][0] == -1 else int(i["shape"][0]), wanted)
                   if len(i["shape"]) else 1 for i in self.inputs)

    def _resize(self, n):
        if self.current == n:
            return
        for i in self.inputs:
            if i["shape_signature"][0] == -1:
                self.interp.resize_tensor_input(i["index"], [n, *i["shape"][1:]])
        self.interp.allocate_tensors()
        self.current = n

    def prepare(self, data, start, stop):
        feed = []
        for i in self.inputs:
            if i["name"] not in data:
                raise SystemExit(f"harness: the data has no array named {i['name']!r} (model input)")
            feed.append((i["index"], _to_input(data[i["name"]][start:stop], i)))
        return feed

    def infer(self, feed):
        self._resize(len(feed[0][1]))
        for index, value in feed:
            self.interp.set_tensor(index, value)
        self.interp.invoke()
        return [_from_output(self.interp.get_tensor(o["index"]), o) for o in self.outputs]

    def timed_loop(self, feeds, store):
        interp, clock = self.interp, time.monotonic_ns
        lat = []
        for i, feed in enumerate(feeds):
            self._resize(len(feed[0][1]))
            for index, value in feed:
                interp.set_tensor(index, value)
            t0 = clock()
            interp.invoke()
            lat.append(clock() - t0)
            store(i, [_from_output(interp.get_tensor(o["index"]), o) for o in self.outputs])
        return lat


def _quantized(detail):
    scale, _ = detail.get("quantization", (0.0, 0))
    return scale != 0.0 and np.issubdtype(detail["dtype"], np.integer)


def _to_input(value, detail):
    dtype = detail["dtype"]
    if value.dtype == dtype:
        return value
    if _quantized(detail) and np.issubdtype(value.dtype, np.floating):
        scale, zero = detail["quantization"]
        info = np.iinfo(dtype)
        return np.clip(np.round(value / scale + zero), info.min, info.max).astype(dtype)
    return value.astype(dtype)


def _from_output(value, detail):
    if _quantized(detail):
        scale, zero = detail["quantization"]
        return ((value.astype(np.float32) - zero) * scale).astype(np.float32)
    return value


# --- the run --------------------------------------------------------------------------


def make_runner(args):
    return TfliteRunner(args) if args.runtime == "tflite" else OnnxRunner(args)


def run(args):
    data, n = load_data(args.data)
    runner = make_runner(args)
    inject_fault()
    batch = runner.batch_size(args.batch_size)
    feeds = [runner.prepare(data, a, b) for a, b in slices(n, batch)]
    for _ in range(args.warmup):
        runner.infer(feeds[0])
    store = Outputs(slices(n, batch), runner.output_names)
    if args.compare_rounds:
        runner.extra["compare"] = [compare_round(runner, feeds, store) for _ in range(args.compare_rounds)]
    latencies = runner.timed_loop(feeds, store)
    return runner, batch, n, store.arrays(), latencies


def compare_round(runner, feeds, store):
    harness = runner.timed_loop(feeds, store)
    bare, whole = bare_loop(runner, feeds)
    return {"harness_median_ns": _median(harness), "bare_median_ns": _median(bare), "bare_loop_ns_per_call": whole}


def _median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class Outputs:
    """Each call's outputs copied into arrays allocated once, outside the timed region."""

    def __init__(self, spans, names):
        self.spans, self.names, self.buffers = spans, names, None

    def __call__(self, i, outs):
        start, stop = self.spans[i]
        if self.buffers is None:
            for name, o in zip(self.names, outs):
                if o.ndim == 0 or o.shape[0] != stop - start:
                    raise SystemExit(f"harness: output {name!r} {o.shape} has no sample axis first")
            self.buffers = [np.empty((self.spans[-1][1], *o.shape[1:]), o.dtype) for o in outs]
        for buffer, o in zip(self.buffers, outs):
            buffer[start:stop] = o

    def arrays(self):
        return dict(zip(self.names, self.buffers))


def bare_loop(runner, feeds):
    """The loop a user would write by hand: a plain `session.run` loop, timed per call and as a whole."""
    if isinstance(runner, OnnxRunner):
        session, names = runner.session, runner.output_names
        lat = []
        start = time.monotonic_ns()
        for feed in feeds:
            t0 = time.monotonic_ns()
            session.run(names, feed)
            lat.append(time.monotonic_ns() - t0)
    else:
        interp, lat = runner.interp, []
        start = time.monotonic_ns()
        for feed in feeds:
            for index, value in feed:
                interp.set_tensor(index, value)
            t0 = time.monotonic_ns()
            interp.invoke()
            lat.append(time.monotonic_ns() - t0)
    return lat, (time.monotonic_ns() - start) / len(feeds)


def write(args, runner, batch, n, outputs, latencies):
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, "outputs.npz"), **outputs)
    versions = {"numpy": np.__version__, "python": platform.python_version(), **runner.versions}
    result = {
        "runtime": args.runtime,
        "versions": versions,
        "machine": platform.machine(),
        "threads": args.threads,
        "batch_size": batch,
        "n_samples": n,
        "warmup": args.warmup,
        "latencies_ns": [int(x) for x in latencies],
        "extra": {**runner.extra, "clock": "time.monotonic_ns"},
    }
    tmp = os.path.join(args.out, "result.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(result, fh, indent=1)
    os.replace(tmp, os.path.join(args.out, "result.json"))


def main(argv=None):
    faulthandler.enable()
    args = parse_args(argv)
    runner, batch, n, outputs, latencies = run(args)
    write(args, runner, batch, n, outputs, latencies)
    print(f"harness: {n} samples in {len(latencies)} calls on {platform.machine()}, "
          f"median {sorted(latencies)[len(latencies) // 2] / 1e6:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
