"""Two targets run concurrently (run_targets, 2 threads) versus one after the other, side by side.

    .venv/bin/python bench/bench_parallel.py [--samples 300] [--repeat 3]
        [--targets x86_64-cpu-onnxruntime,x86_64-cpu-tflite]

The same small CNN as ONNX (onnxruntime classes) and as TFLite (tflite classes,
made with TensorFlow here); images are built (or reused) before timing.
Each repetition times the sequential run and the concurrent run (order
alternating) and prints the wall times and their ratio. The target:
concurrent < sequential.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_harness import cnn_model, data_for, sha256
from tiergate.build import build_image
from tiergate.execution import Job, execute, run_targets
from tiergate.targets import resolve


def timed(fn) -> float:
    t0 = time.monotonic()
    results = fn()
    for result in results:
        if not result.ok:
            raise SystemExit(f"{result.device_class}: {result.reason}\n{result.log_tail}")
    return time.monotonic() - t0


def tflite_cnn(path: Path) -> Path:
    """The same shape of network as bench_harness.cnn_model, in TFLite (NHWC input named 'x')."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    kernels = [tf.constant((rng.standard_normal((3, 3, c, 16)) * 0.2).astype(np.float32)) for c in (3, 16, 16)]

    @tf.function(input_signature=[tf.TensorSpec([None, 64, 64, 3], tf.float32, name="x")])
    def net(x):
        for k in kernels:
            x = tf.nn.relu(tf.nn.conv2d(x, k, 1, "SAME"))
        return tf.reduce_mean(x, axis=[1, 2])

    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions([net.get_concrete_function()], net).convert())
    return path


def nhwc(data: Path, path: Path) -> Path:
    """The ONNX data (NCHW) transposed for the TFLite model (NHWC)."""
    import numpy as np

    with np.load(data) as npz:
        np.savez(path, x=npz["x"].transpose(0, 2, 3, 1))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--targets", default="x86_64-cpu-onnxruntime,x86_64-cpu-tflite")
    args = parser.parse_args()
    classes = resolve(args.targets)
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-") as tmp:
        work = Path(tmp)
        models = {"onnx": cnn_model(work / "cnn.onnx")}
        if any(dc.artifact_format == "tflite" for dc in classes):
            models["tflite"] = tflite_cnn(work / "cnn.tflite")
        data = data_for(models["onnx"], args.samples, work / "data.npz")
        jobs = []
        for dc in classes:
            model = models[dc.artifact_format]
            image = build_image(dc, model, artifact_sha256=sha256(model))
            jobs.append(Job(dc, data if dc.artifact_format == "onnx" else nhwc(data, work / "nhwc.npz"),
                            work / dc.name, image=image))
        sequential, concurrent = [], []
        for r in range(args.repeat):
            runs = [("seq", lambda: [execute(job) for job in jobs]),
                    ("par", lambda: run_targets(jobs, max_parallel=len(jobs)))]
            for name, fn in (runs if r % 2 == 0 else runs[::-1]):
                (sequential if name == "seq" else concurrent).append(timed(fn))
    seq, par = statistics.median(sequential), statistics.median(concurrent)
    print(f"targets {', '.join(dc.name for dc in classes)}; cnn model, {args.samples} samples, {args.repeat} repetitions")
    print(f"{'one after the other':<22} {seq:7.2f} s   ({', '.join(f'{x:.2f}' for x in sequential)})")
    print(f"{'concurrent (2 threads)':<22} {par:7.2f} s   ({', '.join(f'{x:.2f}' for x in concurrent)})")
    print(f"concurrent / sequential = {par / seq:.3f}   target < 1: {'met' if par < seq else 'NOT met'}")


if __name__ == "__main__":
    main()
