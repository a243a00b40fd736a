"""Instructions ratio (emulated, counted) against native time ratio (interleaved pairs), on real models (issue 24).

    .venv/bin/python bench/bench_insn_vs_time.py [--samples 20] [--cases paddle-unfused,paddle-int8,...]

Each case is a candidate and its FP32 reference gated on an emulated class under the counting QEMU (candidate /
reference instructions per inference) and on the native class of the same runtime (candidate / reference latency
from the candidate's calls interleaved with the reference's in one process: the median per-pair ratio and its 95 %
interval). Printed side by side, with the two emulated runs' time ratio (QEMU time) for comparison: how far an
instruction count predicts this host's time, model by model. Real models: PaddleOCR's text-direction classifier
(ONNX; its variant with BatchNormalizations left unfused, and its INT8), silero VAD (ONNX; specialized to 16 kHz,
and its INT8) and MediaPipe's face detector (TFLite; its INT8 by TensorFlow Lite's quantizer).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from realmodels import kit  # noqa: E402
from tiergate.execution.counting import counter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ONNX = ("arm64-cpu-onnxruntime", "x86_64-cpu-onnxruntime")
TFLITE = ("arm64-cpu-tflite", "x86_64-cpu-tflite")


def cases(work: Path, samples: int) -> dict:
    """name -> (candidate, reference, data, (emulated class, native class))."""
    paddle = kit.fetch("paddleocr_cls")
    x, y = kit.text_lines(samples, seed=0)
    np.savez(work / "lines.npz", x=x, labels=y)
    calibration, _ = kit.text_lines(32, seed=1)
    silero = kit.fetch("silero_vad")
    feeds = kit.vad_feeds(silero, kit.vad_chunks(samples + 64, seed=0))
    silero_16k, silero_int8 = kit.silero_int8(silero, work, feeds[samples:])
    face = kit.fetch("face_detection")
    rng = np.random.default_rng(0)
    np.savez(work / "faces.npz", input=rng.uniform(-1, 1, (samples, 128, 128, 3)).astype(np.float32))
    face_cal = rng.uniform(-1, 1, (16, 128, 128, 3)).astype(np.float32)
    vad = kit.vad_loader(work, feeds[:samples])
    return {
        "paddle-unfused": (lambda: kit.unfused_batchnorm(paddle, work), paddle, work / "lines.npz", ONNX),
        "paddle-int8": (lambda: kit.int8_calibrated(paddle, work, calibration), paddle, work / "lines.npz", ONNX),
        "silero-16k": (lambda: silero_16k, silero, vad, ONNX),
        "silero-int8": (lambda: silero_int8, silero, vad, ONNX),
        "face-int8": (lambda: kit.tflite_int8(face, work, face_cal), face, work / "faces.npz", TFLITE),
    }


def gate(candidate, reference, data, classes, home: Path) -> dict:
    cmd = [str(ROOT / ".venv" / "bin" / "tiergate"), "gate", "-c", str(candidate), "-r", str(reference), "-d",
           str(data), "-t", ",".join(classes), "--no-early-stop", "--json", "--policy", str(home.parent / "count.toml")]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TIERGATE_HOME": str(home)})
    if done.returncode not in (0, 1, 3):
        raise SystemExit(f"gate failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--cases", default="")
    args = p.parse_args()
    if counter() is None:
        print("no counting QEMU set up: run scripts/build-counting-qemu (scripts/setup does)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-insn-time-"))
    # instructions are counted where a policy judges them: a limit no candidate reaches asks for them, changing nothing
    (work / "count.toml").write_text("[defaults]\nmax_instructions_ratio = 1000.0\n")
    table = cases(work, args.samples)
    wanted = [c for c in args.cases.split(",") if c] or list(table)
    print(f"{'case':16} {'instructions ratio (emulated)':>30} {'native time ratio, 95% CI (pairs)':>40} "
          f"{'QEMU time ratio':>16}")
    for name in wanted:
        make, reference, data, classes = table[name]
        doc = gate(make(), reference, data, classes, work / "home")
        emulated, native = (doc["metrics"][c] for c in classes)
        insn = emulated["device_ratios"].get("instructions_ratio")
        interval = native.get("latency_ratio_interval") or {}
        time_ratio = (f"{interval['estimate']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}] "
                      f"({native['latency_pairs']})" if interval else "n/a")
        qemu = emulated.get("latency_ratio_vs_reference")
        print(f"{name:16} {insn if insn is None else format(insn, '.3f'):>30} {time_ratio:>40} "
              f"{qemu if qemu is None else format(qemu, '.3f'):>16}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
