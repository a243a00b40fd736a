"""Latency measured by the harness versus a bare `session.run` loop in the same container.

    .venv/bin/python bench/bench_harness.py [--samples 300] [--rounds 5] [--device-class x86_64-cpu-onnxruntime]

Same image, same model, same threads, same data, same process: each container
alternates rounds of the harness's timed loop and of a bare `session.run` loop
(timed per call with the same clock, and as a whole loop); the harness option
is --compare-rounds. Prints the medians side by side and the median over all
rounds of harness median / bare median (the hook in containers/harness/harness_bench.py). The target: at most 1.03, with the device
figures measured as in every run (memory readings from the kernel: VmHWM, cgroup
peak, peak resets; load and first-call timing). Also prints each model's device
figures and what one memory reading costs (read /proc/self/status + reset VmHWM),
timed here on the same kernel: the harness makes four per run, none inside a
timed region.

Also home of the small models the other execution benchmarks use.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tiergate.build import build_image
from tiergate.execution import Job, execute
from tiergate.targets import resolve

TARGET = 1.03


def mlp_model(path: Path, seed: int = 0) -> Path:
    """A tiny MLP (x [N, 64] -> [N, 10]): a few microseconds per call, the worst case for overhead."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W1", (64, 128)), ("B1", (128,)), ("W2", (128, 10)), ("B2", (10,)))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"]), helper.make_node("Add", ["a", "B1"], ["b"]),
             helper.make_node("Relu", ["b"], ["c"]), helper.make_node("MatMul", ["c", "W2"], ["d"]),
             helper.make_node("Add", ["d", "B2"], ["y"])]
    return _save(nodes, inits, ["N", 64], ["N", 10], path)


def cnn_model(path: Path, seed: int = 0) -> Path:
    """Three 3x3 convolutions on 3x64x64 images (x [N, 3, 64, 64] -> [N, 16]): about a millisecond per call."""
    rng = np.random.default_rng(seed)
    inits, nodes, prev, channels = [], [], "x", 3
    for i in range(3):
        inits += [numpy_helper.from_array((rng.standard_normal((16, channels, 3, 3)) * 0.2).astype(np.float32), f"K{i}"),
                  numpy_helper.from_array(np.zeros(16, np.float32), f"C{i}")]
        nodes += [helper.make_node("Conv", [prev, f"K{i}", f"C{i}"], [f"v{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"v{i}"], [f"r{i}"])]
        prev, channels = f"r{i}", 16
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
    return _save(nodes, inits, ["N", 3, 64, 64], ["N", 16], path)


def _save(nodes, inits, in_shape, out_shape, path: Path) -> Path:
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def data_for(model: Path, n: int, path: Path) -> Path:
    shape = [n if not isinstance(d, int) else d for d in
             [d.dim_value or "N" for d in onnx.load(str(model)).graph.input[0].type.tensor_type.shape.dim]]
    np.savez(path, x=np.random.default_rng(1).standard_normal(shape).astype(np.float32))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def measure(dc_name: str, model: Path, samples: int, rounds: int, containers: int, work: Path) -> dict:
    """`containers` runs, each alternating `rounds` harness and bare loops in one process."""
    dc = resolve([dc_name])[0]
    image = build_image(dc, model, artifact_sha256=sha256(model))
    data = data_for(model, samples, work / f"{model.stem}.npz")
    rows = []
    for c in range(containers):
        result = execute(Job(dc, data, work / f"{model.stem}-{c}", image=image, compare_rounds=rounds))
        if not result.ok:
            raise SystemExit(f"{dc_name} {model.name}: {result.reason}\n{result.log_tail}")
        rows += result.extra["compare"]
    ratios = [r["harness_median_ns"] / r["bare_median_ns"] for r in rows]
    return {"harness": statistics.median(r["harness_median_ns"] for r in rows),
            "bare": statistics.median(r["bare_median_ns"] for r in rows),
            "whole": statistics.median(r["bare_loop_ns_per_call"] for r in rows),
            "ratio": statistics.median(ratios), "ratios": ratios, "device": result.device}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5, help="harness/bare alternations per container")
    parser.add_argument("--containers", type=int, default=3)
    parser.add_argument("--device-class", default="x86_64-cpu-onnxruntime")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-") as tmp:
        work = Path(tmp)
        print(f"device class {args.device_class}, {args.samples} samples, batch 1, "
              f"{args.containers} containers x {args.rounds} alternating rounds")
        print(f"{'model':<6} {'harness median':>15} {'bare median':>12} {'bare loop/call':>15} "
              f"{'ratio (median)':>15}  per-round ratios")
        worst, figures = 0.0, {}
        for build in (mlp_model, cnn_model):
            model = build(work / f"{build.__name__.removesuffix('_model')}.onnx")
            m = measure(args.device_class, model, args.samples, args.rounds, args.containers, work)
            worst = max(worst, m["ratio"])
            figures[model.stem] = m["device"]
            print(f"{model.stem:<6} {m['harness'] / 1e3:>12.1f} us {m['bare'] / 1e3:>9.1f} us "
                  f"{m['whole'] / 1e3:>12.1f} us {m['ratio']:>15.3f}  "
                  + " ".join(f"{x:.3f}" for x in m["ratios"]))
        print(f"target: harness/bare median ratio <= {TARGET} with memory readings on: "
              f"{'met' if worst <= TARGET else 'NOT met'} (worst {worst:.3f})")
        print(f"one memory reading (status + peak reset): {memory_reading_us():.1f} us; 4 per run, outside timing")
        for name, fig in figures.items():
            print(f"{name:<6} device figures: peak {fig.peak_memory_bytes / 2**20:.1f} MiB "
                  f"(load +{fig.load_memory_bytes / 2**20:.1f}, inference +{fig.inference_memory_bytes / 2**20:.1f}), "
                  f"load {fig.load_ms:.2f} ms, first call {fig.first_inference_ms:.3f} ms, "
                  f"size {fig.artifact_bytes} B, cgroup peak "
                  f"{'-' if fig.cgroup_peak_bytes is None else f'{fig.cgroup_peak_bytes / 2**20:.1f} MiB'}")


def memory_reading_us(n: int = 2000) -> float:
    """Microseconds per harness memory reading (the harness's own functions), median of 5 batches."""
    import sys

    from tiergate.paths import containers_dir

    sys.path.insert(0, str(containers_dir() / "harness"))
    import harness_memory

    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            harness_memory.status()
            harness_memory.reset_peak()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


if __name__ == "__main__":
    main()
