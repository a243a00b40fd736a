"""Per-op time (--profile): where an inference call spends its time, per op type and per node.

Imported by tiergate_harness.py only for --profile. It runs after the timed loop
and the memory readings, so it changes none of the other figures: a second
session (onnxruntime, with SessionOptions.enable_profiling) runs up to
PROFILE_CALLS of the evaluation batches after one warm-up call, and its
profiling JSON (Chrome trace events; kernel events are named
"<node>_kernel_time" with args.op_name) is summed per op type and per node.

LiteRT's Python interpreter exposes no op profiler (the C++ benchmark_model
has one): the profile then says it is unavailable, and why.

Written to result.json's device.op_profile:
  available  true / false;  reason (when false);  source;  calls (profiled calls)
  by_op_type {op: {"total_ms", "calls", "nodes"}}   (times summed over the calls)
  nodes      [{"name", "op_type", "total_ms", "provider"}], slowest first
"""

from __future__ import annotations

import json
import os
import tempfile

PROFILE_CALLS = 20


class ProfileHook:
    def __init__(self):
        self.args = None

    def before_load(self, args):
        self.args = args

    def after_timed_loop(self, runner, feeds):
        if hasattr(runner, "session"):
            profile = onnx_profile(self.args, runner, feeds[:PROFILE_CALLS])
        elif "tvm" in runner.versions:
            profile = {"available": False, "source": "tvm", "calls": 0,
                       "reason": "the compiled library is run without TVM's profiler (its VM profiles only a "
                                 "library built with profiling)"}
        else:
            profile = {"available": False, "source": "ai-edge-litert", "calls": 0,
                       "reason": "the LiteRT Python interpreter exposes no op profiler (benchmark_model has one)"}
        runner.device["op_profile"] = profile


def hook():
    return ProfileHook()


def onnx_profile(args, runner, feeds) -> dict:
    """A profiled session: one warm-up call, then `feeds`; the warm-up's events are dropped."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="tiergate-profile-") as folder:
        opts.profile_file_prefix = os.path.join(folder, "ort")
        session = ort.InferenceSession(args.model, sess_options=opts, providers=runner.session.get_providers())
        names = runner.output_names
        session.run(names, feeds[0])
        for feed in feeds:
            session.run(names, feed)
        events = _events(session.end_profiling())
        del session
    return summarize(events, len(feeds))


def _events(path: str) -> list[dict]:
    with open(path) as fh:
        data = json.load(fh)
    events = data if isinstance(data, list) else data.get("traceEvents", [])
    return [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]


def summarize(events: list[dict], calls: int) -> dict:
    """Sum kernel events per op type and per node over the last `calls` calls."""
    per_node: dict[str, list[dict]] = {}
    for e in events:
        per_node.setdefault(e["name"].removesuffix("_kernel_time"), []).append(e)
    by_op: dict[str, dict] = {}
    nodes = []
    for name, evs in per_node.items():
        evs = evs[-calls:] if calls else evs
        args = evs[0].get("args", {})
        op = args.get("op_name", "?")
        total_ms = sum(float(e.get("dur", 0)) for e in evs) / 1e3   # trace events are in microseconds
        nodes.append({"name": name, "op_type": op, "total_ms": round(total_ms, 6),
                      "provider": args.get("provider", "")})
        entry = by_op.setdefault(op, {"total_ms": 0.0, "calls": 0, "nodes": 0})
        entry["total_ms"] = round(entry["total_ms"] + total_ms, 6)
        entry["calls"] += len(evs)
        entry["nodes"] += 1
    nodes.sort(key=lambda n: -n["total_ms"])
    return {"available": bool(nodes), "source": "onnxruntime profiling JSON", "calls": calls,
            "reason": "" if nodes else "the profile held no kernel events",
            "by_op_type": dict(sorted(by_op.items(), key=lambda kv: -kv[1]["total_ms"])), "nodes": nodes}
