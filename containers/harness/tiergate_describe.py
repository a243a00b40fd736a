"""tiergate's in-container describer: the graph a tier's runtime really runs.

Depends only on numpy and the runtime (onnxruntime, onnxruntime-gpu or ai-edge-litert);
it must never import tiergate. It runs inside the device class's runtime image (so an
emulated arm64 class describes arm64's graph) and writes to the output folder:

  describe.json        what the runtime says (below)
  optimized-LEVEL.onnx onnxruntime only: the optimized model at each level (basic, extended, all),
                       written by onnxruntime itself (SessionOptions.optimized_model_filepath)

describe.json: {"ok", "runtime", "versions", "machine", "error" (the runtime's own message when it
refuses the model), and per runtime:
  onnxruntime: "default_level" (the level a plain SessionOptions uses: what the harness runs),
    "disabled" (the graph transformers switched off, as the run had them), "transformers" {LEVEL: [[name,
    times applied, times it modified the graph], ...] in the order onnxruntime first applied them, read from its
    own verbose log (graph_transformer.cc: "GraphTransformer NAME modified: 0|1")},
    "providers", "levels" (every level; in a run's describe, its own level only): {LEVEL: {"file", "placement" {ep: n}, "nodes" [[name, "domain:op_type", ep],
    ...] (the provider assignment, made when the graph is partitioned), "seconds"}}; op counts are
    read from the optimized files by the host (they need the onnx package)
  tflite: "ops" {"op": n}, "nodes" [[index, op, "xnnpack"|"default"]], "delegated" (count),
    "needs_delegate" (custom ops that only the XNNPACK delegate resolves: unresolved without it)
  tvm: "tvm" (the compile's record beside the library, tvm-meta.json, as is: the passes applied with the
    module's structural hash after each, target, opt level, times; containers/tvm/tiergate_tvm_compile.py)}

Exit 0 when described, 1 when the runtime refuses the model (describe.json still written), 2 on
bad arguments. The harness runs `describe()` in a run's own container after the candidate's run
(tiergate_harness.py --describe): a gate describes a tier without a container or interpreter of its own.

Usage:
  python tiergate_describe.py --runtime onnxruntime --model M.onnx --out DIR [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time

# harness_cpu.py: beside this script in a checkout, in the runtime image's harness folder inside a container
sys.path.append("/opt/tiergate/harness")
from harness_cpu import cpu_info  # noqa: E402

LEVELS = ("basic", "extended", "all")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtime", required=True, choices=("onnxruntime", "onnxruntime-gpu", "tflite", "tvm", "ethos-u"))
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--disable", action="append", default=[], help="a pass switched off (repeatable)")
    return p.parse_args(argv)


def one_line(exc) -> str:
    text = " ".join(str(exc).split())
    return (text or type(exc).__name__)[:1500]    # onnxruntime names the newest opset it reads at the very end


# --- onnxruntime ----------------------------------------------------------------------


_APPLIED = re.compile(r"GraphTransformer (\S+) modified: ([01])")


def session_logged(make):
    """`make()` (an InferenceSession made at verbose severity) with fd 2 captured: (its result, the log's text).
    onnxruntime's default logger writes to the process's stderr; the capture puts fd 2 back in any case."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            result = make()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        return result, log.read().decode("utf-8", "replace")


def transformers_of(log):
    """[[name, applied, modified], ...] in first-applied order from onnxruntime's verbose log."""
    seen = {}
    for name, modified in _APPLIED.findall(log):
        entry = seen.setdefault(name, [name, 0, 0])
        entry[1] += 1
        entry[2] += int(modified)
    return list(seen.values())


def describe_onnx(args, doc):
    import onnxruntime as ort

    if args.runtime == "onnxruntime-gpu" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    providers = ["CPUExecutionProvider"]
    if args.runtime == "onnxruntime-gpu":
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    level_enum = onnx_head(ort, doc, getattr(args, "disabled", None))
    disabled = doc["disabled"]
    for level in (doc["default_level"],) if getattr(args, "own_level", False) else LEVELS:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = level_enum[level]
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        name = describing(opts, args.out, level)
        t0 = time.monotonic()
        more = {"disabled_optimizers": disabled} if disabled else {}
        try:
            session, log = session_logged(lambda: ort.InferenceSession(args.model, sess_options=opts,
                                                                        providers=providers, **more))
        except Exception as exc:  # noqa: BLE001 - the runtime's refusal, in its own words
            doc["ok"], doc["error"], doc["failed_level"] = False, one_line(exc), level
            return 1
        level_described(doc, level, name, session, log, time.monotonic() - t0)
        del session
    return 0


def onnx_head(ort, doc, disabled=None):
    """doc's onnxruntime fields before any session (versions, default_level, disabled; levels and transformers
    empty): -> {level name: onnxruntime's GraphOptimizationLevel}."""
    level_enum = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                  "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    default = ort.SessionOptions().graph_optimization_level
    doc["versions"] = {"onnxruntime": ort.__version__}
    doc["default_level"] = next((name for name, value in level_enum.items() if value == default), str(default))
    doc["levels"] = {}
    doc["disabled"], doc["transformers"] = sorted(disabled or []), {}
    return level_enum


def describing(opts, out, level):
    """Set SessionOptions `opts` so that the session made with them describes itself: verbose log (each
    transformer's "modified" line: transformers_of), the optimized model written by onnxruntime into `out`, the
    provider assignment recorded. -> the optimized file's name."""
    opts.log_severity_level = 0
    opts.log_verbosity_level = 0
    name = f"optimized-{level}.onnx"
    opts.optimized_model_filepath = os.path.join(out, name)
    opts.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return name


def level_described(doc, level, name, session, log, seconds):
    """doc's entries for one level, from the session made with `describing` options and its captured log."""
    doc["transformers"][level] = transformers_of(log)
    doc["providers"] = session.get_providers()
    nodes = []
    for subgraph in session.get_provider_graph_assignment_info():
        for node in subgraph.get_nodes():
            nodes.append([node.name, f"{node.domain}:{node.op_type}", subgraph.ep_name])
    placement = {}
    for _, _, ep in nodes:
        placement[ep] = placement.get(ep, 0) + 1
    # the assignment is made when the graph is partitioned (after the basic level); the extended
    # and all levels fuse nodes within one provider afterwards: op counts come from the file
    doc["levels"][level] = {"file": name, "placement": placement, "nodes": nodes, "seconds": round(seconds, 3)}


class OwnSession:
    """A run's own onnxruntime session, describing itself (the harness's --describe-at-load): its options set as
    the describer's at the level the run executes, its log captured while it is made, and describe.json written
    from it, the same document a describe after the run writes, without a second session (under QEMU an INT8's
    takes half a second or more). The run's load time then includes the verbose log and the optimized file's
    save: the harness asks for it where load time is not gated (emulated classes)."""

    def __init__(self, ort, runtime, out, disabled=()):
        self.doc = head_doc(runtime)
        onnx_head(ort, self.doc, disabled)
        self.out, self.log, self.name = out, "", None

    def options(self, opts):
        os.makedirs(self.out, exist_ok=True)
        self.name = describing(opts, self.out, self.doc["default_level"])

    def make(self, make):
        session, self.log = session_logged(make)
        return session

    def write(self, session, seconds):
        level_described(self.doc, self.doc["default_level"], self.name, session, self.log, seconds)
        self.log = ""
        write_doc(self.doc, self.out)


# --- LiteRT (TFLite) ------------------------------------------------------------------


def describe_tflite(args, doc):
    import ai_edge_litert
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    doc["versions"] = {"ai-edge-litert": getattr(ai_edge_litert, "__version__", "")}
    doc["disabled"] = sorted(getattr(args, "disabled", None) or [])
    bare = {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    try:
        interp = Interpreter(model_path=args.model, num_threads=args.threads,
                             **(bare if "XNNPACK" in doc["disabled"] else {}))
        interp.allocate_tensors()
    except Exception as exc:  # noqa: BLE001 - e.g. "Encountered unresolved custom op: ..."
        doc["ok"], doc["error"] = False, one_line(exc)
        return 1
    details = interp._get_ops_details()
    plain = [d for d in details if d["op_name"] != "DELEGATE"]
    count = len(plain)
    delegated = _delegated(details, count)
    doc["nodes"] = [[d["index"], d["op_name"], "xnnpack" if d["index"] in delegated else "default"] for d in plain]
    ops = {}
    for d in plain:
        ops[d["op_name"]] = ops.get(d["op_name"], 0) + 1
    doc["ops"] = dict(sorted(ops.items()))
    doc["delegated"] = len(delegated)
    doc["delegates"] = len(details) - count
    # ops the runtime resolves only through the delegate: without it the model does not load
    doc["needs_delegate"] = []
    try:
        Interpreter(model_path=args.model, num_threads=args.threads, **bare).allocate_tensors()
    except Exception as exc:  # noqa: BLE001
        doc["needs_delegate"] = [{"message": one_line(exc)}]
    return 0


# --- TVM: a library tiergate's build step compiled ---------------------------------


def describe_tvm(args, doc):
    """What the compile recorded beside the library (tvm-meta.json: the passes applied, each with the module's
    structural hash after it, the target, opt level and times), read as is: the host parses it."""
    path = os.path.join(os.path.dirname(os.path.abspath(args.model)), "tvm-meta.json")
    try:
        with open(path) as fh:
            doc["tvm"] = json.load(fh)
    except (OSError, ValueError) as exc:
        doc["ok"], doc["error"] = False, f"no compile record beside the library: {one_line(exc)}"
        return 1
    doc["versions"] = {"tvm": doc["tvm"].get("tvm_version", "")}
    doc["disabled"] = sorted(getattr(args, "disabled", None) or [])
    return 0


def _delegated(details, count):
    """Node indices each DELEGATE node replaced: walk back from its outputs to its inputs."""
    producer = {int(t): d["index"] for d in details[:count] for t in d["outputs"]}
    covered = set()
    for delegate in details[count:]:
        stop = {int(t) for t in delegate["inputs"]}
        todo = [int(t) for t in delegate["outputs"]]
        while todo:
            tensor = todo.pop()
            node = producer.get(tensor)
            if tensor in stop or node is None or node in covered:
                continue
            covered.add(node)
            todo.extend(int(t) for t in details[node]["inputs"] if int(t) >= 0)
    return covered


def describe_ethos_u(args, doc):
    """An Ethos-U class's artifact: what Vela's compile recorded beside the model (vela-meta.json: each operator's
    placement, NPU or CPU with Vela's reason, and the estimate), read as is: the host parses it
    (tiergate.npu.placement). The model beside it is what the tier's reference kernels run."""
    path = os.path.join(os.path.dirname(os.path.abspath(args.model)), "vela-meta.json")
    try:
        with open(path) as fh:
            doc["vela"] = json.load(fh)
    except (OSError, ValueError) as exc:
        doc["ok"], doc["error"] = False, f"no Vela record beside the model: {one_line(exc)}"
        return 1
    doc["versions"] = {"ethos-u-vela": doc["vela"].get("vela_version", "")}
    return 0


def describe(runtime, model, out, threads=1, own_level=False, disabled=()):
    """Describe `model` on this runtime into `out` (describe.json, optimized-LEVEL.onnx): the exit code.
    `own_level`: onnxruntime's default level only, the one a run executes (not basic and extended too). The
    harness calls it so, in a run's own container after the candidate's run (`--describe`)."""
    args = argparse.Namespace(runtime=runtime, model=model, out=out, threads=threads, own_level=own_level,
                              disabled=list(disabled))
    os.makedirs(out, exist_ok=True)
    doc = head_doc(runtime)
    code = {"tflite": describe_tflite, "tvm": describe_tvm, "ethos-u": describe_ethos_u}.get(
        runtime, describe_onnx)(args, doc)
    write_doc(doc, out)
    if code:
        print(f"describe: {runtime} refuses the model: {doc['error']}", file=sys.stderr)
    return code


def head_doc(runtime):
    """describe.json's fields common to every runtime."""
    return {"ok": True, "runtime": runtime, "machine": platform.machine(), "cpu": cpu_info(), "error": ""}


def write_doc(doc, out):
    path = os.path.join(out, "describe.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh)
    os.replace(path + ".tmp", path)


def main(argv=None):
    args = parse_args(argv)
    return describe(args.runtime, args.model, args.out, args.threads, disabled=args.disable)


if __name__ == "__main__":
    sys.exit(main())
