"""tiergate's in-container harness: run one artifact over one evaluation set.

Depends only on numpy and the runtime (onnxruntime, onnxruntime-gpu,
ai-edge-litert, or tvm for a library tiergate's build step compiled); it must
never import tiergate. It loads the artifact, warms up, runs the evaluation
inputs in batches, times each inference call with a monotonic nanosecond clock
and writes to the output folder:

  outputs.npz   one array per model output (first axis = sample: an output whose
                batch axis is elsewhere, e.g. a recurrent state [2, batch, 128],
                is moved so that it comes first)
  result.json   what it can know: machine, runtime versions, threads, batch size,
                n_samples, warmup, latencies_ns (one per inference call), extra,
                device (the device figures: load_ms, first_inference_ms,
                artifact_bytes, peak memory and its shares, op_profile; under the
                counting QEMU, TIERGATE_COUNT_OUT set: instructions per inference
                and the load's, from marker syscalls: harness_insn.py)

Usage:
  python tiergate_harness.py --runtime onnxruntime --model M.onnx --out DIR [--model M2 --out DIR2 ...]
      --data D.npz [--samples START:STOP] [--threads 1] [--batch-size 1] [--warmup 3]
      [--eval-batch 0] [--latency-calls 16] [--eval-workers 1 [--eval-slots 0]] [--compare-rounds 0] [--profile]
      [--timeout 0] [--describe N]
      [--pair-index N --pair-model P [--pair-model P2] --pairs 200 --pairs-seconds 30]

Several artifacts, one process start: `--model`/`--out` pairs run in order over the same
data. The runtime library is imported and the data read once; each artifact then runs in
a child process forked from there (so its memory figures, and a crash, are its own: a
child that dies leaves `failed.json` with the reason in its folder, and the next artifact
runs). One pair runs in this process. `--samples START:STOP` evaluates that range of the
data only (a shard of a tier's run). `--timeout S`: each child has S seconds (its load, warm-up
and every call); one still running then is killed, its failed.json says "timed out after S s"
(`timed_out`: true), and the next artifact runs with its own S seconds: a hung candidate times out
alone. (A single artifact runs in this process: the host's timeout is its own.)

Batched evaluation (`--eval-batch N`, N > the device class's batch size, where the model's
batch dimension is dynamic): latency is timed on `--latency-calls` calls at the class's
batch size (whose outputs are kept); then every sample's outputs are computed in calls of
N samples. The batched outputs of the timed samples are compared with their single-call
outputs: if any differs beyond float rounding (|a - b| > 1e-4 * max|a| + 1e-6; integers:
exactly) the batched outputs are discarded and every sample runs at the class's batch
size. extra.evaluation says what was done and what the comparison found. `--latency-calls 0`
(a shard whose latency another shard times): nothing is timed; the cold first call alone is
made, and its outputs are what the batched ones are checked against.

Batched calls at once (`--eval-workers W`, onnxruntime only: its session.run may be called from
several threads; each call keeps --threads): W threads of the artifact's process claim the batched
calls in order from a schedule fixed by (samples, --eval-batch, W): calls of --eval-batch that shrink
towards the end (a quarter of what is left per worker, at least 8 samples), so the threads end
together. At most `allowed` calls run at once in the whole container (CallSlots: flock'ed files, an
int shared with the children): --eval-slots at the start (0: W), one more per SIGUSR1 the host sends
(after this harness prints READY_MARK) as it takes another run slot. With several artifacts, the next
one's child starts once this one has handed out its last batched call: its load and single calls run
beside that call and this one's describe. extra.evaluation then says eval_workers, eval_at_once
(the most calls that ran at once) and eval_slots (the slots granted by the end); eval_ms_per_sample
is the calls' own time per sample.

Load time (session / interpreter creation, EP and delegate set-up included; the
runtime library's import is not in it) and the cold first call are timed here,
apart from the steady state: the first call is always made on its own and counts
as the first warm-up call; the timed loop follows the remaining warm-up calls.

Sample axes: an archive may carry `__tiergate_axes__` (JSON written by tiergate's
evaldata: {"inputs": {name: axis or null}, "outputs": {name: axis}}); an input's
samples are sliced along its axis, a null axis (a 0-d array) is a constant fed
whole to every call. An output's sample axis is the one given, else the axis of
an input whose per-call shape it has, else the first axis of the call's batch size.
Feeds are prepared (contiguous) before the timed loop.

Quantized TFLite inputs are quantized from float data with the input's scale and
zero point; quantized outputs are dequantized to float32 (listed in
extra.dequantized_outputs), so every result compares with the FP32 reference.

This file is the core loop only. Hooks plug into it, each from its own file in
this folder, imported only when its option or variable is set:

  harness_memory.py  every run: peak resident memory from the kernel (VmHWM, the
                     container's cgroup peak), and the shares added by loading
                     and by inference, in result.json's device table.
  harness_profile.py --profile: per-op time (onnxruntime's profiling JSON) in
                     device.op_profile, from a separate session after the timed loop.
  harness_bench.py   --compare-rounds N (bench/bench_harness.py): N rounds of
                     the timed loop alternated with a bare `session.run` /
                     `invoke` loop; medians in extra.compare.
  harness_paired.py  --pair-model P: after artifact --pair-index's run, its calls
                     interleaved with each P's in one process (rotating order), up to
                     --pairs rounds: extra.paired (native latency ratios, docs/policy.md).
  harness_faults.py  TIERGATE_HARNESS_FAULT=segv|hang (tests only): a real
                     SIGSEGV, or a sleep forever, after the model is loaded.

A hook is any object with some of these methods (HOOK_POINTS), called in order:
  before_load(args)
      the data is read, the model is not loaded yet;
  loaded(runner)
      the model is loaded, nothing has run yet (runner.device holds load_ms);
  before_timed_loop(runner, feeds, store)
      after warm-up, before the timed loop; it may call runner.timed_loop(feeds,
      store) itself and add to runner.extra (written to result.json's extra);
  after_timed_loop(runner, feeds)
      the timed loop is done; it may add to runner.device (result.json's device).
No hook runs inside the timed loop or around a timed call; a plain run imports
only harness_memory.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import platform
import signal
import sys
import time

sys.dont_write_bytecode = True  # hooks imported from a source checkout leave no __pycache__ there
# numpy is the harness's data handling only (the runtime has its own kernels and the class's threads): no BLAS
# thread pool. The artifacts' children are forked from this process, and a fork of a process with threads that
# then starts threads of its own (--eval-workers) crashed now and then under the counting QEMU (a child's silent
# SIGSEGV or SIGABRT, 2 of 18 repeats of one gate test beside a CPU hog; none in 34 with this set)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

LABELS = "labels"
AXES_MEMBER = "__tiergate_axes__"
FAULT_ENV = "TIERGATE_HARNESS_FAULT"
CONTAINER_ENV = "TIERGATE_IN_CONTAINER"   # set by the Docker backend: the run has its own container (and cgroup)
HOOK_POINTS = ("before_load", "loaded", "before_timed_loop", "after_timed_loop")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", required=True, choices=("onnxruntime", "onnxruntime-gpu", "tflite", "tvm", "ethos-u"))
    p.add_argument("--model", required=True, action="append", dest="models",
                   help="an artifact (repeatable; paired in order with --out)")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True, action="append", dest="outs")
    p.add_argument("--samples", default="", help="START:STOP, the range of the data to evaluate (default all)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--eval-batch", type=int, default=0,
                   help="samples per call for outputs where the batch dimension is dynamic (0: --batch-size)")
    p.add_argument("--latency-calls", type=int, default=16,
                   help="with --eval-batch: calls timed for latency (0: none; the cold first call checks batching)")
    p.add_argument("--eval-workers", type=int, default=1,
                   help="with --eval-batch: threads of this process making the batched calls at once (onnxruntime)")
    p.add_argument("--eval-slots", type=int, default=0,
                   help="with --eval-workers: batched calls at once from the start (0: every worker); SIGUSR1 adds one")
    p.add_argument("--compare-rounds", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="per-op time in device.op_profile")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="seconds each artifact's child may take (several artifacts); 0: no limit")
    p.add_argument("--describe", type=int, action="append", default=[], metavar="N",
                   help="after artifact N's run (0-based, repeatable), describe its runtime graph at the level it "
                        "ran into its --out (tiergate_describe.py: describe.json, optimized-LEVEL.onnx)")
    p.add_argument("--disabled", action="append", default=[], metavar="N=PASS,PASS",
                   help="artifact N's optimizer passes switched off (repeatable): onnxruntime graph transformers "
                        "(disabled_optimizers), XNNPACK for LiteRT's default delegate")
    p.add_argument("--pair-model", action="append", default=[],
                   help="after artifact --pair-index's run, interleave its calls with this model's (repeatable; "
                        "harness_paired.py: result.json's extra.paired)")
    p.add_argument("--pair-index", type=int, default=0)
    p.add_argument("--pairs", type=int, default=200)
    p.add_argument("--pairs-seconds", type=float, default=30.0)
    args = p.parse_args(argv)
    if len(args.models) != len(args.outs):
        p.error("give one --out per --model")
    args.model, args.out = args.models[0], args.outs[0]
    args.disabled_of = {}
    for item in args.disabled:
        index, _, names = item.partition("=")
        if not index.isdigit() or not names:
            p.error(f"--disabled {item!r}: give N=PASS[,PASS...]")
        args.disabled_of[int(index)] = [n for n in names.split(",") if n]
    args.disabled_passes = args.disabled_of.get(0, [])
    return args


def load_data(path, samples=""):
    """(arrays by input name, sample count, {"inputs": axes, "outputs": axes}); `samples` "START:STOP" keeps
    that range of every input along its sample axis."""
    with np.load(path, allow_pickle=False) as npz:
        data = {name: npz[name] for name in npz.files if name not in (LABELS, AXES_MEMBER)}
        meta = json.loads(str(npz[AXES_MEMBER][()])) if AXES_MEMBER in npz.files else {}
    if not data:
        raise SystemExit(f"harness: {path}: no input arrays")
    axes = {name: meta.get("inputs", {}).get(name, 0 if a.ndim else None) for name, a in data.items()}
    sizes = {a.shape[axes[name]] for name, a in data.items() if axes[name] is not None}
    if len(sizes) != 1:
        raise SystemExit(f"harness: {path}: inputs differ in sample count {sorted(sizes)}")
    n = sizes.pop()
    if samples:
        start, stop = (int(x) for x in samples.split(":"))
        if not 0 <= start < stop <= n:
            raise SystemExit(f"harness: --samples {samples}: not a range of the data's {n} samples")
        data = {name: take(a, axes[name], start, stop) for name, a in data.items()}
        n = stop - start
    return data, n, {"inputs": axes, "outputs": meta.get("outputs", {})}


def take(array, axis, start, stop):
    """Samples [start, stop) along `axis`, contiguous; a constant (axis None) whole."""
    if axis is None:
        return array
    return np.ascontiguousarray(array[(slice(None),) * axis + (slice(start, stop),)])


def batch_for(dim0, wanted):
    """A fixed leading dimension decides the batch; a symbolic one takes the device class's."""
    return dim0 if isinstance(dim0, int) and dim0 > 0 else wanted


def slices(n, batch):
    return [(start, min(start + batch, n)) for start in range(0, n, batch)]


# --- hooks ----------------------------------------------------------------------------


def _plugin(name):
    """A hook module from this folder, imported on demand."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def load_hooks(args):
    """The hooks this run asks for; none (and no import) for a plain run."""
    hooks = [_plugin("harness_memory").hook()]     # first: its readings come before any other hook's work
    if os.environ.get(FAULT_ENV):
        hooks.append(_plugin("harness_faults").hook(os.environ[FAULT_ENV]))
    if args.compare_rounds:
        hooks.append(_plugin("harness_bench").hook(args.compare_rounds))
    if args.profile:
        hooks.append(_plugin("harness_profile").hook())
    return hooks


def call_hooks(hooks, point, *args):
    for hook in hooks:
        method = getattr(hook, point, None)
        if method is not None:
            method(*args)


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
        disabled = list(getattr(args, "disabled_passes", []))
        self.session = ort.InferenceSession(args.model, sess_options=opts, providers=providers,
                                            **({"disabled_optimizers": disabled} if disabled else {}))
        if args.runtime == "onnxruntime-gpu" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise SystemExit("harness: onnxruntime-gpu: the CUDA execution provider is not available")
        self.inputs = self.session.get_inputs()
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.versions = {"onnxruntime": ort.__version__}
        self.extra = {"providers": self.session.get_providers()}
        self.concurrent = True       # session.run may be called from several threads at once

    def batch_size(self, wanted, axes):
        sizes = [batch_for(i.shape[axes.get(i.name, 0)], wanted) for i in self.inputs
                 if i.shape and axes.get(i.name, 0) is not None]
        return min(sizes) if sizes else 1

    def prepare(self, data, start, stop, axes):
        feed = {}
        for i in self.inputs:
            if i.name not in data:
                raise SystemExit(f"harness: the data has no array named {i.name!r} (model input)")
            feed[i.name] = take(data[i.name], axes.get(i.name, 0), start, stop)
        return feed

    def infer(self, feed):
        return self.session.run(self.output_names, feed)

    def timed_loop(self, feeds, store, mark=None):
        run, names, clock = self.session.run, self.output_names, time.monotonic_ns
        lat = []
        for i, feed in enumerate(feeds):
            if mark:
                mark(CALL)
            t0 = clock()
            out = run(names, feed)
            lat.append(clock() - t0)
            if mark:
                mark(CALLED)
            store(i, out)
            del out  # freed before the next call, as in a bare loop
        return lat


# --- LiteRT (TFLite) ------------------------------------------------------------------


class TfliteRunner:
    """LiteRT's interpreter (XNNPACK by default). `reference`: its reference kernels (OpResolverType.BUILTIN_REF),
    an Ethos-U class's numeric model (--runtime ethos-u: the model is the source TFLite, Vela's record beside it
    goes to extra.npu)."""

    def __init__(self, args, reference=False):
        import ai_edge_litert
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        disabled = list(getattr(args, "disabled_passes", []))
        unknown = [name for name in disabled if name != "XNNPACK"]
        if unknown:
            raise SystemExit(f"harness: LiteRT has no pass named {', '.join(unknown)} (it can switch off: XNNPACK)")
        bare = {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES} if disabled else {}
        if reference:
            bare = {"experimental_op_resolver_type": OpResolverType.BUILTIN_REF}
        self.interp = Interpreter(model_path=args.model, num_threads=args.threads, **bare)
        self.interp.allocate_tensors()
        self.inputs = self.interp.get_input_details()
        self.outputs = self.interp.get_output_details()
        self.output_names = [o["name"] for o in self.outputs]
        self.versions = {"ai-edge-litert": getattr(ai_edge_litert, "__version__", "")}
        self.extra = {"dequantized_outputs": [o["name"] for o in self.outputs if _quantized(o)]}
        if reference:
            self.extra["op_resolver"] = "BUILTIN_REF"
            self.extra["npu"] = _vela_record(args.model)
            self.versions["ethos-u-vela"] = self.extra["npu"].get("vela_version", "")
        self.current = None
        self.axes = {}

    def batch_size(self, wanted, axes):
        self.axes = axes
        sizes = []
        for i in self.inputs:
            axis = axes.get(i["name"], 0)
            if len(i["shape"]) and axis is not None:
                sig = i["shape_signature"][axis]
                sizes.append(batch_for(-1 if sig == -1 else int(i["shape"][axis]), wanted))
        return min(sizes) if sizes else 1

    def _resize(self, n):
        if self.current == n:
            return
        for i in self.inputs:
            axis = self.axes.get(i["name"], 0)
            if axis is not None and len(i["shape"]) and i["shape_signature"][axis] == -1:
                shape = list(i["shape"])
                shape[axis] = n
                self.interp.resize_tensor_input(i["index"], shape)
        self.interp.allocate_tensors()
        self.current = n

    def prepare(self, data, start, stop, axes):
        feed = []
        for i in self.inputs:
            if i["name"] not in data:
                raise SystemExit(f"harness: the data has no array named {i['name']!r} (model input)")
            feed.append((i["index"], _to_input(take(data[i["name"]], axes.get(i["name"], 0), start, stop), i)))
        return feed, stop - start

    def infer(self, feed):
        feed, n = feed
        self._resize(n)
        for index, value in feed:
            self.interp.set_tensor(index, value)
        self.interp.invoke()
        return [_from_output(self.interp.get_tensor(o["index"]), o) for o in self.outputs]

    def timed_loop(self, feeds, store, mark=None):
        interp, clock = self.interp, time.monotonic_ns
        lat = []
        for i, (feed, n) in enumerate(feeds):
            self._resize(n)
            for index, value in feed:
                interp.set_tensor(index, value)
            if mark:
                mark(CALL)
            t0 = clock()
            interp.invoke()
            lat.append(clock() - t0)
            if mark:
                mark(CALLED)
            store(i, [_from_output(interp.get_tensor(o["index"]), o) for o in self.outputs])
        return lat


def _vela_record(model):
    """Vela's record beside the model (vela-meta.json, tiergate's Ethos-U compile), without its per-layer rows."""
    path = os.path.join(os.path.dirname(os.path.abspath(model)), "vela-meta.json")
    try:
        with open(path) as fh:
            record = json.load(fh)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"harness: no Vela record beside the model ({exc})")
    return {k: v for k, v in record.items() if k != "layers"}


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


# --- TVM: the library tiergate's build step compiled ----------------------------------


TVM_META = "tvm-meta.json"    # the compile's record beside the library (containers/tvm/tiergate_tvm_compile.py)


class TvmRunner:
    """The relax VM over the library the build step compiled (model.so); its inputs and outputs are named as the
    ONNX model's, from the compile's record beside it. Shapes are static: the batch is the compiled one."""

    def __init__(self, args):
        os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")    # `import tvm` loads the runtime library only
        os.environ["TVM_NUM_THREADS"] = str(args.threads)    # read when TVM's thread pool starts (first call)
        import tvm
        from tvm.runtime.vm import VirtualMachine

        with open(os.path.join(os.path.dirname(os.path.abspath(args.model)), TVM_META)) as fh:
            meta = json.load(fh)
        disabled = sorted(getattr(args, "disabled_passes", []) or [])
        if disabled != sorted(meta.get("disabled_passes", [])):
            raise SystemExit(f"harness: the library was compiled with passes {meta.get('disabled_passes')} off, "
                             f"the run asks for {disabled}")
        self.tensor = tvm.runtime.tensor
        self.main = VirtualMachine(tvm.runtime.load_module(args.model), tvm.cpu())["main"]
        self.inputs = meta["inputs"]
        self.output_names = [o["name"] for o in meta["outputs"]]
        self.versions = {"tvm": tvm.__version__}
        self.extra = {"tvm": {"target": meta.get("target"), "opt_level": meta.get("opt_level"),
                              "passes": len(meta.get("passes", []))}}

    def batch_size(self, wanted, axes):
        """The compiled batch, whatever is wanted (static shapes: a larger --eval-batch is never taken)."""
        sizes = [i["shape"][axes.get(i["name"], 0)] for i in self.inputs
                 if i["shape"] and axes.get(i["name"], 0) is not None]
        return min(sizes) if sizes else 1

    def prepare(self, data, start, stop, axes):
        feed = []
        for i in self.inputs:
            if i["name"] not in data:
                raise SystemExit(f"harness: the data has no array named {i['name']!r} (model input)")
            value = take(data[i["name"]], axes.get(i["name"], 0), start, stop)
            if list(value.shape) != list(i["shape"]):
                raise SystemExit(f"harness: input {i['name']!r} {list(value.shape)} is not the compiled shape "
                                 f"{i['shape']}")
            feed.append(self.tensor(np.ascontiguousarray(value, dtype=i["dtype"])))
        return feed

    @staticmethod
    def _outputs(out):
        return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]

    def infer(self, feed):
        return self._outputs(self.main(*feed))

    def timed_loop(self, feeds, store, mark=None):
        main, outputs, clock = self.main, self._outputs, time.monotonic_ns
        lat = []
        for i, feed in enumerate(feeds):
            if mark:
                mark(CALL)
            t0 = clock()
            out = main(*feed)
            lat.append(clock() - t0)
            if mark:
                mark(CALLED)
            store(i, outputs(out))
            del out
        return lat


# --- the run --------------------------------------------------------------------------


INSN_ENV = "TIERGATE_COUNT_OUT"      # harness_insn.COUNT_ENV: set by the host when the counting QEMU runs us
LOAD, LOADED, CALL, CALLED = 1, 2, 3, 4    # harness_insn's marker codes


def make_runner(args):
    if args.runtime == "tvm":
        return TvmRunner(args)
    if args.runtime == "ethos-u":
        return TfliteRunner(args, reference=True)
    return TfliteRunner(args) if args.runtime == "tflite" else OnnxRunner(args)


def run(args, hooks=(), loaded_data=None):
    data, n, axes = loaded_data or load_data(args.data, args.samples)
    call_hooks(hooks, "before_load", args)
    insn = _plugin("harness_insn") if os.environ.get(INSN_ENV) else None    # under the counting QEMU only
    mark = insn.marker() if insn else None
    if mark:      # the runtime imported before the load's markers, as it is for several artifacts (main)
        importlib.import_module(_plugin("harness_memory").RUNTIME_MODULE[args.runtime])
        mark(LOAD)
    clock = time.monotonic_ns
    t0 = clock()
    runner = make_runner(args)
    load_ns = clock() - t0
    if mark:
        mark(LOADED)
    runner.device = {"load_ms": load_ns / 1e6, "artifact_bytes": artifact_bytes(args.model)}
    call_hooks(hooks, "loaded", runner)
    batch = runner.batch_size(args.batch_size, axes["inputs"])
    eval_batch = runner.batch_size(args.eval_batch, axes["inputs"]) if args.eval_batch > batch else batch
    batched = eval_batch > batch and n > batch
    timed = min(n, max(batch, args.latency_calls)) if batched else n
    spans = slices(timed, batch)
    feeds = [runner.prepare(data, a, b, axes["inputs"]) for a, b in spans]
    t0 = clock()
    first = runner.infer(feeds[0])              # the cold first call, apart from the steady state
    runner.device["first_inference_ms"] = (clock() - t0) / 1e6
    store = Outputs(spans, runner.output_names, lambda span: sample_axes(data, axes, span))
    if batched and args.latency_calls == 0:     # nothing timed here: the first call's outputs check batching
        store(0, first)
        latencies = []
    else:
        for _ in range(args.warmup - 1):
            runner.infer(feeds[0])
        call_hooks(hooks, "before_timed_loop", runner, feeds, store)
        latencies = runner.timed_loop(feeds, store, mark)
        call_hooks(hooks, "after_timed_loop", runner, feeds)
    del first
    if insn:
        runner.device.update(insn.figures(args.threads))
    del feeds
    evaluation = {"batched": False, "latency_batch": batch, "latency_calls": len(latencies)}
    if batched:
        store, evaluation = batched_outputs(runner, data, n, axes, batch, eval_batch, store, args.eval_workers,
                                            getattr(args, "slots", None), getattr(args, "last_claimed", None))
    runner.extra["evaluation"] = evaluation
    runner.extra["output_sample_axes"] = dict(zip(store.names, store.axes or []))
    return runner, batch, n, store.arrays(), latencies


def eval_schedule(n, eval_batch, workers):
    """The calls of a batched evaluation: `eval_batch` samples each, and where several workers share them, calls
    that shrink towards the end (a quarter of what is left per worker, at least 8 samples), so that the workers
    end together; fixed by (n, eval_batch, workers) alone, whichever worker makes which call."""
    if workers <= 1:
        return slices(n, eval_batch)
    spans, start = [], 0
    while start < n:
        size = min(eval_batch, max(8, -(-(n - start) // (2 * workers))), n - start)
        spans.append((start, start + size))
        start += size
    return spans


class CallSlots:
    """How many batched calls may run at once in this container, across the artifacts' processes: `allowed` (an
    int in memory shared with every child forked after it is made) of the lock files under a temporary folder,
    each held (flock) by the call that runs. The kernel lets a lock go when its holder dies, so a child that crashes
    mid-call takes no slot with it. The host gives a run another CPU with SIGUSR1 (`grant`, from the harness's
    main process), up to `most`."""

    def __init__(self, now, most):
        import mmap
        import tempfile

        self.most = max(1, most)
        self.folder = tempfile.mkdtemp(prefix="tiergate-slots-")
        self.shared = mmap.mmap(-1, 8)         # MAP_SHARED | MAP_ANONYMOUS: the children see the parent's grants
        self.set(min(max(1, now), self.most))

    def allowed(self):
        return int.from_bytes(self.shared[:8], "little")

    def set(self, n):
        self.shared[:8] = int(n).to_bytes(8, "little")

    def grant(self, *_):
        self.set(min(self.allowed() + 1, self.most))

    def take(self):
        """An open, locked slot file (close it to give the slot back)."""
        import fcntl

        while True:
            for k in range(self.allowed()):
                fd = os.open(os.path.join(self.folder, str(k)), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except OSError:
                    os.close(fd)
            time.sleep(0.02)


def concurrent_calls(runner, spans, call, workers, slots=None, last_claimed=None, room=None):
    """call(i, span) for every span, on up to `workers` threads of this process claiming the spans in order (a
    runtime whose calls may run at once: onnxruntime's session.run; each call uses the device class's threads as
    before), each call holding one of `slots` (CallSlots) while it runs, and a call beside another only while
    `room()` says one more fits in memory. `last_claimed()` is called once the last span is handed out (the next
    artifact may start). -> the most calls that ran at once. The first error raised ends the evaluation."""
    workers = min(workers, len(spans)) if getattr(runner, "concurrent", False) else 1
    if workers <= 1 or slots is None:
        for i, span in enumerate(spans):
            if i == len(spans) - 1 and last_claimed is not None:
                last_claimed()
            call(i, span)
        return 1
    import threading

    claim, errors, lock, at_once = iter(range(len(spans))), [], threading.Lock(), [0, 0]    # now, most

    def work():
        while not errors:
            fd = slots.take()
            if at_once[0] and room is not None and not room():
                os.close(fd)          # another call runs, and one more would not fit under the memory limit
                time.sleep(0.05)
                continue
            try:
                with lock:
                    i = next(claim, None)
                    if i is not None:
                        at_once[0] += 1
                        at_once[1] = max(at_once)
                if i is None:
                    return
                if i == len(spans) - 1 and last_claimed is not None:
                    last_claimed()
                try:
                    call(i, spans[i])
                finally:
                    with lock:
                        at_once[0] -= 1
            except BaseException as exc:  # noqa: BLE001 - raised in the main thread below
                errors.append(exc)
            finally:
                os.close(fd)
    threads = [threading.Thread(target=work, name=f"eval-{k}", daemon=True) for k in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return at_once[1]


def batched_outputs(runner, data, n, axes, batch, eval_batch, timed_store, workers=1, slots=None,
                    last_claimed=None):
    """Every sample's outputs in calls of `eval_batch` (on up to `workers` threads: concurrent_calls), checked
    against the timed calls' outputs; on a difference beyond float rounding, every sample at `batch` instead.
    (the store to keep, extra.evaluation)"""
    clock, memory, single = time.monotonic_ns, _plugin("harness_memory"), runner.device.get("inference_memory_bytes")
    workers = workers if getattr(runner, "concurrent", False) else 1
    eval_batch = memory.fitting_batch(single, eval_batch, batch, workers)     # so that the workers' calls fit at once
    spans = eval_schedule(n, eval_batch, workers)
    store = Outputs(spans, runner.output_names, lambda span: sample_axes(data, axes, span))
    call_ns = []

    def call(i, span):
        feed = runner.prepare(data, *span, axes["inputs"])
        t0 = clock()
        out = runner.infer(feed)
        call_ns.append(clock() - t0)
        store(i, out)
    most = concurrent_calls(runner, spans, call, workers, slots, last_claimed,
                            room=memory.call_room(single, eval_batch, batch))
    eval_ns = sum(call_ns)      # the calls' own time: per sample, what one worker spends
    checked = timed_store.spans[-1][1]
    worst, agree = consistency(timed_store.arrays(), store.arrays(), checked)
    evaluation = {"batched": agree, "latency_batch": batch, "latency_calls": len(timed_store.spans),
                  "eval_batch": eval_batch, "eval_calls": len(spans), "eval_ms_per_sample": eval_ns / 1e6 / n,
                  "checked_samples": checked, "max_abs_diff": worst}
    if workers > 1:     # threads making the calls, the most calls that ran at once, and the call slots granted
        evaluation.update(eval_workers=workers, eval_at_once=most,
                          eval_slots=slots.allowed() if slots is not None else 1)
    if agree:
        return store, evaluation
    evaluation["reason"] = (f"outputs of calls of {eval_batch} samples differ from calls of {batch} by up to "
                            f"{worst:.3g}: every sample evaluated at batch {batch}")
    spans = slices(n, batch)
    single = Outputs(spans, runner.output_names, lambda span: sample_axes(data, axes, span))
    for i, (a, b) in enumerate(spans):
        single(i, runner.infer(runner.prepare(data, a, b, axes["inputs"])))
    return single, evaluation


def consistency(timed, batched, k):
    """(largest |difference| over the first k samples, whether every output agrees within float rounding)."""
    worst, agree = 0.0, True
    for name, a in timed.items():
        b = batched[name][:k]
        if a.shape != b.shape:
            return float("inf"), False
        if np.issubdtype(a.dtype, np.floating):
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            if not (np.array_equal(np.isnan(a64), np.isnan(b64)) and np.array_equal(np.isinf(a64), np.isinf(b64))):
                return float("inf"), False
            finite = np.isfinite(a64)
            diff = float(np.max(np.abs(a64[finite] - b64[finite]), initial=0.0))
            scale = float(np.max(np.abs(a64[finite]), initial=0.0))
            worst = max(worst, diff)
            agree = agree and diff <= 1e-4 * scale + 1e-6
        else:
            same = np.array_equal(a, b)
            worst = max(worst, 0.0 if same else float("inf"))
            agree = agree and same
    return worst, agree


def artifact_bytes(model):
    """The artifact's size: in tiergate's container the model's folder holds it and its external data only."""
    if os.environ.get(CONTAINER_ENV):
        folder = os.path.dirname(os.path.abspath(model))
        return sum(os.path.getsize(p) for p in (os.path.join(folder, f) for f in os.listdir(folder))
                   if os.path.isfile(p))
    return os.path.getsize(model)


def sample_axes(data, axes, span):
    """Per output: its sample axis from the first call's output (see the module's docstring)."""
    size = span[1] - span[0]
    calls = [(take(a, axes["inputs"][name], *span).shape, axes["inputs"][name]) for name, a in data.items()
             if axes["inputs"][name] is not None]
    given = axes.get("outputs", {})

    def axis_of(name, out):
        if name in given:
            return given[name]
        for shape, axis in calls:
            if out.shape == shape:
                return axis
        for axis, dim in enumerate(out.shape):
            if dim == size:
                return axis
        raise SystemExit(f"harness: output {name!r} {out.shape} has no axis of the call's {size} samples")
    return axis_of


class Outputs:
    """Each call's outputs copied into arrays allocated once, outside the timed region (sample axis first); the
    calls may come from several threads, in any order. `axes_for(span)`: the function naming each output's sample
    axis from a call over `span` (sample_axes)."""

    def __init__(self, spans, names, axes_for=None):
        import threading

        self.spans, self.names, self.buffers, self.axes = spans, names, None, None
        self.axes_for = axes_for or (lambda span: (lambda name, o: 0))
        self.made = threading.Lock()        # concurrent calls (concurrent_calls): the buffers are made once

    def __call__(self, i, outs):
        start, stop = self.spans[i]
        if self.buffers is None:
            with self.made:
                if self.buffers is None:
                    self._make(outs, self.spans[i])
        for buffer, o, axis in zip(self.buffers, outs, self.axes):
            buffer[start:stop] = np.moveaxis(o, axis, 0) if axis else o

    def _make(self, outs, span):
        axis_of = self.axes_for(span)
        axes = [axis_of(name, o) if o.ndim else None for name, o in zip(self.names, outs)]
        for name, o, axis in zip(self.names, outs, axes):
            if axis is None or o.shape[axis] != span[1] - span[0]:
                raise SystemExit(f"harness: output {name!r} {o.shape} has no sample axis")
        self.axes = axes
        self.buffers = [np.empty((self.spans[-1][1], *np.delete(o.shape, axis)), o.dtype)
                        for o, axis in zip(outs, axes)]

    def arrays(self):
        return dict(zip(self.names, self.buffers))


def write(args, runner, batch, n, outputs, latencies):
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, "outputs.npz"), **outputs)
    versions = {"numpy": np.__version__, "python": platform.python_version(), **runner.versions}
    result = {
        "runtime": args.runtime,
        "versions": versions,
        "machine": platform.machine(),
        "cpu": _plugin("harness_cpu").cpu_info(),
        "threads": args.threads,
        "batch_size": batch,
        "n_samples": n,
        "warmup": args.warmup,
        "latencies_ns": [int(x) for x in latencies],
        "extra": {**runner.extra, "clock": "time.monotonic_ns",
                  **({"disabled_passes": sorted(args.disabled_passes)} if getattr(args, "disabled_passes", None)
                     else {})},
        "device": getattr(runner, "device", {}),
    }
    write_json(os.path.join(args.out, "result.json"), result)


def write_json(path, doc):
    """`doc` at `path`, whole or not at all (a reader never sees half a file)."""
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(path + ".tmp", path)


READY_MARK = "harness: ready for more call slots"   # SIGUSR1 (a slot more) is handled from here on


def call_slots(args):
    """With --eval-workers N > 1: the container's CallSlots, --eval-slots of them at first (the host's run slots
    held at the start), one more per SIGUSR1 (another slot the host took since), at most N."""
    if args.eval_workers <= 1:
        return None
    slots = CallSlots(args.eval_slots or args.eval_workers, args.eval_workers)
    signal.signal(signal.SIGUSR1, slots.grant)
    print(READY_MARK, flush=True)
    return slots


def main(argv=None):
    faulthandler.enable()
    args = parse_args(argv)
    args.slots = call_slots(args)
    if len(args.models) == 1:
        loaded = load_data(args.data, args.samples)
        runner, batch, n, outputs, latencies = run(args, load_hooks(args), loaded)
        write(args, runner, batch, n, outputs, latencies)
        say(runner, n, latencies)
        del runner, outputs
        describe_after(args, 0 in args.describe)
        pair_after(args, loaded, args.pair_model and args.pair_index == 0)
        return 0
    loaded = load_data(args.data, args.samples)          # once for every artifact
    os.environ[_plugin("harness_memory").SHARED_ENV] = "1"     # the cgroup's peak is no one artifact's
    importlib.import_module(_plugin("harness_memory").RUNTIME_MODULE[args.runtime])  # once, before the children
    # with call slots, the next artifact starts once this one has handed out its last batched call (its load and
    # single calls then run beside that call and this one's describe); otherwise once this one has ended
    running = []       # (index, its args, pid, deadline), oldest first

    def reap():        # the oldest artifacts that have ended: their folders are complete
        while running:
            done, status = os.waitpid(running[0][2], os.WNOHANG)
            if not done:
                return
            finish(*running.pop(0)[:2], status)

    for n, (model, out) in enumerate(zip(args.models, args.outs)):
        child = argparse.Namespace(**{**vars(args), "model": model, "out": out, "describe_it": n in args.describe,
                                      "disabled_passes": args.disabled_of.get(n, []),
                                      "pair_it": bool(args.pair_model) and n == args.pair_index})
        running.append((n, child, *start_child(child, loaded, overlap=args.slots is not None, meanwhile=reap)))
        if args.slots is None:
            n, child, pid, deadline = running.pop()
            finish(n, child, wait_child(pid, deadline))
    while running:
        n, child, pid, deadline = running.pop(0)
        finish(n, child, wait_child(pid, deadline))
    return 0


def finish(n, args, status):
    finish_child(args, status)
    print(f"{DONE_MARK}{n}", flush=True)      # the host may collect this artifact's folder now


FAILED_FILE = "failed.json"
DONE_MARK = "harness: finished artifact "     # + its index: its folder is complete (result or failed.json)


def start_child(args, loaded, overlap=False, meanwhile=None):
    """One artifact in a forked child: its own peak memory, and its crash is its own (failed.json says why).
    -> (pid, deadline: its --timeout from now, or None). With `overlap`, returns once the child has handed out its
    last batched call (or ended, or run out of time), calling `meanwhile()` every 0.2 s until then; else at once."""
    os.makedirs(args.out, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    ready_r, ready_w = os.pipe() if overlap else (None, None)
    pid = os.fork()
    if pid == 0:                                       # the child: run, write, leave without cleanup
        if ready_r is not None:
            os.close(ready_r)
            args.last_claimed = _say_ready([ready_w])
        code = 0
        try:
            runner, batch, n, outputs, latencies = run(args, load_hooks(args), loaded)
            write(args, runner, batch, n, outputs, latencies)
            say(runner, n, latencies)
            del runner, outputs
            describe_after(args, args.describe_it)
            pair_after(args, loaded, args.pair_it)
        except SystemExit as exc:                      # the harness's own one-line errors
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
                fail(args.out, str(exc.code), code)
            elif code:
                fail(args.out, f"exited with code {code}", code)
        except BaseException as exc:                  # noqa: BLE001 - the parent goes on with the next artifact
            import traceback

            traceback.print_exc()
            code = 1
            fail(args.out, f"{type(exc).__name__}: {exc}", code)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if ready_r is not None:
        os.close(ready_w)
        import select

        while deadline is None or time.monotonic() < deadline:
            # a byte: the last call is handed out; end of file: the child has ended
            if select.select([ready_r], [], [], 0.2)[0]:
                break
            if meanwhile is not None:
                meanwhile()
        os.close(ready_r)
    return pid, deadline


def _say_ready(fds):
    """A function that writes a byte to the pipe fds[0] and closes it, once (a later call does nothing: the fd's
    number may be another file's by then)."""
    def say_once():
        while fds:
            fd = fds.pop()
            try:
                os.write(fd, b"r")
            except OSError:
                pass
            finally:
                os.close(fd)
    return say_once


def finish_child(args, status):
    """A child's end (its wait status; None: killed past its time): one that died without a word leaves its
    failed.json."""
    if status is None:                                 # past its time: killed, whatever it left is no result
        fail(args.out, f"timed out after {args.timeout:g} s", -9, timed_out=True)
        return
    if os.waitstatus_to_exitcode(status) != 0 and not os.path.exists(os.path.join(args.out, FAILED_FILE)):
        code = os.waitstatus_to_exitcode(status)
        fail(args.out, f"exited with code {code}" if code > 0 else f"killed by signal {-code}", code)


def describe_after(args, wanted):
    """The artifact's runtime graph at the level it ran beside its finished result (the describer's own files),
    when asked: the run's figures are written first, so the describe's session changes none of them. A describe that fails
    leaves no describe.json: the host then describes the artifact in a container of its own."""
    if not wanted:
        return
    try:
        _plugin("tiergate_describe").describe(args.runtime, args.model, args.out, args.threads, own_level=True,
                                              disabled=getattr(args, "disabled_passes", []))
    except Exception as exc:  # noqa: BLE001 - the run is done and stays a result; the host describes it apart
        print(f"harness: describing {args.model} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        try:
            os.remove(os.path.join(args.out, "describe.json"))
        except OSError:
            pass


def pair_after(args, loaded, wanted):
    """The artifact's calls interleaved with --pair-model's (harness_paired.py), after its result is written (so
    no figure of the run changes), added to its result.json as extra.paired; a pairing that fails or does not
    end says why there (extra.paired.error) and the run stays a result."""
    if not wanted:
        return
    path = os.path.join(args.out, "result.json")
    with open(path) as fh:
        device = json.load(fh).get("device") or {}
    own = (device.get("load_ms", 0) + device.get("first_inference_ms", 0)) / 1000

    def failed(text):
        print(f"harness: pairing {args.model} with {args.pair_model} failed: {text}", file=sys.stderr)
        _add_paired(path, {"error": " ".join(str(text).split())[:300]})

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()          # a partner that crashes takes the pairing's process down, not the artifact's run
    if pid == 0:
        try:
            _add_paired(path, _plugin("harness_paired").measure(args, loaded, make_runner, slices, own, failed))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the run is done; the host falls back to its loops
            failed(exc.code if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        failed(f"the pairing's process was killed by signal {-code}" if code < 0 else f"exited with code {code}")


def _add_paired(path, paired):
    with open(path) as fh:
        result = json.load(fh)
    result["extra"]["paired"] = paired
    write_json(path, result)


def wait_child(pid, deadline):
    """The child's wait status; None when it ran past `deadline` (time.monotonic; None: no limit), after killing
    it."""
    if deadline is None:
        return os.waitpid(pid, 0)[1]
    pause = 0.01
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.2)
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        return status
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def fail(out, reason, code, **more):
    with open(os.path.join(out, FAILED_FILE), "w") as fh:
        json.dump({"reason": " ".join(reason.split())[:300], "code": code, **more}, fh)


def say(runner, n, latencies):
    evaluation = runner.extra.get("evaluation", {})
    batched = (f"; outputs in {evaluation['eval_calls']} calls of {evaluation['eval_batch']}"
               if evaluation.get("batched") else "")
    print(f"harness: {n} samples, {len(latencies)} timed calls on {platform.machine()}, "
          + (f"median {sorted(latencies)[len(latencies) // 2] / 1e6:.3f} ms" if latencies else "none timed")
          + batched, flush=True)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)      # every file is written and closed: the interpreter's teardown (0.3 s under QEMU) is skipped
