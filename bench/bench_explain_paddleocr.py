"""Explain time per tier on a real model: PaddleOCR's cls model (copy in /work/shared/models/), its INT8 made
here with quantize_static (QDQ, uint8/int8, per-tensor) on 32 random inputs in [-1, 1].

    PYTHONPATH=src .venv/bin/python bench/bench_explain_paddleocr.py [MODEL] [--samples 8]

Prints the seconds per tier (container start, dump, pairing) and the first divergent layer."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # modelkit


def main() -> int:
    import modelkit
    from tiergate.execution.explain import explain
    from tiergate.orchestrator.explain_ab import docker_runner
    from tiergate.targets import resolve

    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="/work/shared/models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--targets", default="x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, (32, 3, 48, 192)).astype(np.float32)
        int8 = modelkit.quantize_qdq(Path(args.model), work / "cls-int8.onnx", {"x": x})
        np.savez(work / "eval.npz", x=rng.uniform(-1, 1, (args.samples, 3, 48, 192)).astype(np.float32))
        t0 = time.monotonic()
        result = explain(int8, Path(args.model), work / "eval.npz", resolve(args.targets), runner=docker_runner(),
                         samples=args.samples)
        total = time.monotonic() - t0
    for name, item in result.targets.items():
        print(f"{name}: {item.seconds:.1f} s, {len(item.layers)} layers paired, first divergent "
              f"{item.first_divergent}, end-to-end {item.end_to_end_sqnr_db}, error {item.error!r}")
    print(f"total {total:.1f} s for {args.samples} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
