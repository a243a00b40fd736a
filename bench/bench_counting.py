"""What counting instructions costs an emulated run, and how exactly it repeats (issue 24).

    .venv/bin/python bench/bench_counting.py [--samples 20] [--rounds 3] [--device-class arm64-cpu-onnxruntime]

PaddleOCR's direction classifier (FP32) and its variant with a no-op Clip between each Conv and its
BatchNormalization, on an emulated class, run alternately with and without the counting QEMU
(TIERGATE_NO_COUNT=1 turns it off): the same image, data and harness, one container start per run. Prints each
run's wall time (the whole container: start, runtime import, load, evaluation, timed calls), the median
overhead of counting (target: at most 1.20), the instructions per inference of each counted run (they must
agree within 0.5 %: they are exact), and the variant's instructions ratio to FP32.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from realmodels import kit  # noqa: E402
from realmodels.kit import unfused_batchnorm  # noqa: E402
from tiergate.build import build_image  # noqa: E402
from tiergate.execution import Job, execute  # noqa: E402
from tiergate.execution.counting import OFF_ENV, counter  # noqa: E402
from tiergate.targets import resolve  # noqa: E402

TARGET = 1.20


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device-class", default="arm64-cpu-onnxruntime")
    args = p.parse_args()
    if counter() is None:
        print("no counting QEMU set up: run scripts/build-counting-qemu", file=sys.stderr)
        return 2
    (dc,) = resolve(args.device_class)
    work = Path(tempfile.mkdtemp(prefix="bench-counting-"))
    source = kit.fetch("paddleocr_cls")
    models = {"fp32": source, "unfused": unfused_batchnorm(source, work)}
    x, y = kit.text_lines(args.samples, seed=0)
    np.savez(work / "lines.npz", x=x, labels=y)
    images = {name: build_image(dc, path, artifact_sha256=sha256(path)) for name, path in models.items()}
    walls: dict[tuple[str, bool], list[float]] = {}
    counts: dict[str, list[float]] = {}
    calls: dict[tuple[str, bool], list[float]] = {}    # median timed call (ms) per run
    for r in range(args.rounds):
        for name in models:
            for counted in ((True, False) if r % 2 == 0 else (False, True)):
                os.environ.pop(OFF_ENV, None) if counted else os.environ.__setitem__(OFF_ENV, "1")
                t0 = time.monotonic()
                result = execute(Job(dc, work / "lines.npz", work / f"{name}-{r}-{counted}", image=images[name],
                                     eval_batch=dc.evaluation.batch, latency_calls=dc.evaluation.latency_calls))
                wall = time.monotonic() - t0
                assert result.ok, result.reason
                walls.setdefault((name, counted), []).append(wall)
                calls.setdefault((name, counted), []).append(statistics.median(result.latencies_ns) / 1e6)
                got = result.device.instructions_per_inference
                assert (got is not None) == counted, (name, counted, got)
                if counted:
                    counts.setdefault(name, []).append(got)
                print(f"round {r} {name:8s} {'counted' if counted else 'plain  '} {wall:7.1f} s, "
                      f"median call {calls[(name, counted)][-1]:.0f} ms"
                      + (f"  {got:.0f} instructions/call (spread {result.device.instructions_spread:.2e}, "
                         f"load {result.device.load_instructions:.3g}, reads {result.device.reads_per_inference})"
                         if counted else ""), flush=True)
    os.environ.pop(OFF_ENV, None)
    overheads = [statistics.median(walls[(n, True)]) / statistics.median(walls[(n, False)]) for n in models]
    for name, overhead in zip(models, overheads):
        spread = (max(counts[name]) - min(counts[name])) / min(counts[name])
        per_call = statistics.median(calls[(name, True)]) / statistics.median(calls[(name, False)])
        print(f"{name}: counted / plain wall time {overhead:.3f}, median call {per_call:.3f}; "
              f"instructions/call over {len(counts[name])} runs "
              f"{min(counts[name]):.0f} .. {max(counts[name]):.0f} (spread {spread:.2e})")
    print(f"unfused / fp32 instructions per call: "
          f"{statistics.median(counts['unfused']) / statistics.median(counts['fp32']):.4f}")
    worst = max(overheads)
    print(f"counting overhead: {worst:.3f} (target <= {TARGET})")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
