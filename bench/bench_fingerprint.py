"""Fingerprinting a ~100 MB ONNX model versus hashing its bytes with sha256, side by side.

    .venv/bin/python bench/bench_fingerprint.py [--mb 100] [--repeat 5]

Prints the median of each measurement and its ratio to `sha256 of the file's bytes`
(read + hash). The target: fingerprint <= 2x sha256.
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

from tiergate.artifact import load_artifact
from tiergate.fingerprint import fingerprint


def make_model(path: Path, megabytes: int) -> None:
    """A chain of MatMul + Add layers whose float32 weights add up to about `megabytes`."""
    width = 1024
    layers = max(1, megabytes * 2**20 // (width * width * 4))
    rng = np.random.default_rng(0)
    nodes, inits, last = [], [], "x"
    for i in range(layers):
        inits += [numpy_helper.from_array(rng.standard_normal((width, width), dtype=np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(width, dtype=np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"h{i}"])]
        last = f"h{i}"
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.onnx"
        make_model(path, args.mb)
        artifact = load_artifact(path)
        rows = [
            ("sha256 of the file's bytes (read + hash)",
             timed(lambda: hashlib.sha256(path.read_bytes()).hexdigest(), args.repeat)),
            ("fingerprint(artifact), artifact loaded", timed(lambda: fingerprint(artifact), args.repeat)),
            ("load_artifact(path)", timed(lambda: load_artifact(path), args.repeat)),
            ("load_artifact + fingerprint", timed(lambda: fingerprint(load_artifact(path)), args.repeat)),
        ]
        base = rows[0][1]
        print(f"model: {path.stat().st_size / 2**20:.1f} MiB, {len(artifact.nodes)} nodes; "
              f"median of {args.repeat} runs")
        print(f"{'measurement':45} {'seconds':>9} {'x sha256':>9}")
        for label, seconds in rows:
            print(f"{label:45} {seconds:9.3f} {seconds / base:9.2f}")
        verdict = "meets" if rows[1][1] <= 2 * base else "MISSES"
        print(f"fingerprint / sha256 = {rows[1][1] / base:.2f} ({verdict} the <= 2x target)")


if __name__ == "__main__":
    main()
