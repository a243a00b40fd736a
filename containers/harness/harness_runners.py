"""The runtimes: one runner per runtime, each loading one artifact (tiergate_harness.py's core loop).

numpy and that runtime only, imported when the runner is made. Every runner has the same surface:

  batch_size(wanted, axes)           the call's batch: a fixed batch dimension decides it, a dynamic one takes
                                     `wanted` (the device class's; a larger --eval-batch for batched outputs)
  prepare(data, start, stop, axes)   a call's feed for samples [start, stop), made before any timed call
  infer(feed)                        one call; its outputs as numpy arrays
  timed_loop(feeds, store, mark)     one timed call per feed (time.monotonic_ns around the runtime's call only),
                                     outputs to store(i, outputs); `mark`: the counting QEMU's markers, or None
  inputs, output_names, versions, extra, and `concurrent` (set by make_runner: whether its calls may run at once
  in one process, harness_batched.CALLS_AT_ONCE)

OnnxRunner: onnxruntime's InferenceSession (CPU, or CUDA for onnxruntime-gpu). TfliteRunner: LiteRT's interpreter
(XNNPACK by default); quantized inputs are quantized from float data with the input's scale and zero point and
quantized outputs dequantized to float32 (extra.dequantized_outputs), so every result compares with the FP32
reference; with `reference`, its reference kernels (an Ethos-U class's numeric model, Vela's record in extra.npu).
TvmRunner: the relax VM over the library tiergate's build step compiled (static shapes).
"""

from __future__ import annotations

import json
import os
import time

import harness_batched
import numpy as np
from harness_data import batch_for, take

LOAD, LOADED, CALL, CALLED = 1, 2, 3, 4    # harness_insn's marker codes


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
        # --describe-at-load: this session describes itself (tiergate_describe.OwnSession), written after the result
        self.described = own_session(ort, args, disabled)
        if self.described is not None:
            self.described.options(opts)
        make = lambda: ort.InferenceSession(args.model, sess_options=opts, providers=providers,  # noqa: E731
                                            **({"disabled_optimizers": disabled} if disabled else {}))
        self.session = make() if self.described is None else self.described.make(make)
        if args.runtime == "onnxruntime-gpu" and "CUDAExecutionProvider" not in self.session.get_providers():
            raise SystemExit("harness: onnxruntime-gpu: the CUDA execution provider is not available")
        self.inputs = self.session.get_inputs()
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.versions = {"onnxruntime": ort.__version__}
        self.extra = {"providers": self.session.get_providers()}

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


def own_session(ort, args, disabled):
    """A tiergate_describe.OwnSession where this run's session is to describe itself (args.describe_at_load, set
    by the harness for an artifact it describes), else None."""
    if not getattr(args, "describe_at_load", False):
        return None
    import tiergate_describe

    return tiergate_describe.OwnSession(ort, args.runtime, args.out, disabled)


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


def make_runner(args):
    if args.runtime == "tvm":
        runner = TvmRunner(args)
    elif args.runtime == "ethos-u":
        runner = TfliteRunner(args, reference=True)
    else:
        runner = TfliteRunner(args) if args.runtime == "tflite" else OnnxRunner(args)
    runner.concurrent = args.runtime in harness_batched.CALLS_AT_ONCE     # its calls may run at once (threads)
    return runner
