"""Device figures of real models on native x86_64 and emulated arm64: what an edge team sizes a device with.

    .venv/bin/python bench/bench_device_figures.py [--samples 20] [--paddle PATH] [--no-demo] [--no-arm]

Runs each model in its device class's container (the same path as `tiergate gate`, with
--profile) and prints per run: peak resident memory (kernel VmHWM) with the shares added
by loading and by inference, the container's cgroup peak, load time, the cold first
call, median steady-state latency, the artifact's size and the top op types.

Models: the demo's digits models (FP32 ONNX reference, the INT8 QDQ candidate, the
FP32/FP16/INT8 TFLite ones; tiergate.demo) and PaddleOCR's text-direction classifier
(ch_ppocr_mobile_v2.0_cls_infer.onnx, input x [N,3,48,192] in [-1, 1]).
Emulated figures (QEMU user mode) are the emulator's: memory includes QEMU, times are
not a device's.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
from pathlib import Path

import numpy as np

from tiergate.build import build_image
from tiergate.execution import Job, execute
from tiergate.targets import resolve

PADDLE = Path("/work/shared/models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
CLASSES = {"onnx": ("x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"),
           "tflite": ("x86_64-cpu-tflite", "arm64-cpu-tflite")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(name: str, model: Path, fmt: str, data: Path, work: Path, arm: bool) -> None:
    for dc_name in CLASSES[fmt][: 2 if arm else 1]:
        dc = resolve([dc_name])[0]
        image = build_image(dc, model, artifact_sha256=sha256(model))
        result = execute(Job(dc, data, work / f"{name}-{dc_name}", image=image, profile=True))
        if not result.ok:
            print(f"{name:<18} {dc_name:<24} FAILED: {result.reason}")
            continue
        f = result.device
        mib = lambda b: "-" if b is None else f"{b / 2**20:.1f}"  # noqa: E731
        top = ", ".join(f"{op} {ms:.3g}" for op, ms in f.op_profile.top_ops(3)) if f.op_profile.available \
            else "n/a (LiteRT)"
        print(f"{name:<18} {dc_name + (' (emu)' if result.emulated else ''):<30} {mib(f.peak_memory_bytes):>7} "
              f"{mib(f.load_memory_bytes):>7} {mib(f.inference_memory_bytes):>7} {mib(f.cgroup_peak_bytes):>7} "
              f"{f.load_ms:>9.1f} {f.first_inference_ms:>9.2f} "
              f"{statistics.median(result.latencies_ns) / 1e6:>9.3f} {f.artifact_bytes / 1024:>8.1f}  {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--paddle", type=Path, default=PADDLE)
    parser.add_argument("--no-demo", action="store_true")
    parser.add_argument("--no-arm", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-dev-") as tmp:
        work = Path(tmp)
        print(f"{'model':<18} {'device class':<30} {'peak':>7} {'+load':>7} {'+infer':>7} {'cgroup':>7} "
              f"{'load ms':>9} {'1st ms':>9} {'p50 ms':>9} {'size KiB':>8}  top ops (ms/call)   [MiB]")
        if not args.no_demo:
            from tiergate.demo.models import build_demo_set, make_eval_npz

            demo = build_demo_set(work / "demo")
            data = make_eval_npz(work / "digits.npz", args.samples)
            run("digits-fp32.onnx", demo.reference_onnx, "onnx", data, work, not args.no_arm)
            run("digits-fp32.tflite", demo.reference_tflite, "tflite", data, work, not args.no_arm)
            for cand in demo.candidates:
                run(cand.name, cand.path, cand.format, data, work, not args.no_arm)
        if args.paddle.is_file():
            data = work / "paddle.npz"
            rng = np.random.default_rng(0)
            np.savez(data, x=rng.uniform(-1, 1, (args.samples, 3, 48, 192)).astype(np.float32))
            run("ppocr-cls", args.paddle, "onnx", data, work, not args.no_arm)


if __name__ == "__main__":
    main()
