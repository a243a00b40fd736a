"""TVM tiers against onnxruntime on the same tier, in one run: compile time, per-inference latency, and how far the
compiled model's outputs are from onnxruntime's FP32 outputs on the host.

PaddleOCR's text-direction classifier (FP32, fetched from its pinned wheel rapidocr-onnxruntime==1.4.4, the same
cache as tests/realmodels) on --samples text lines (seed 1) rendered as tests/realmodels/kit.py does:

  1. images: the compiler image and every class's runtime image built (or found) first, untimed;
  2. COMPILE, per TVM class: tiergate.build.compiling.compiled() in a fresh TIERGATE_HOME (an empty compile cache), the
     input made static from the data's shape ([1, 3, 48, 192]): its wall time, and from the compile's record the
     time in tvm.compile (the passes and lowering), in export_library (LLVM's object code and the link), and the
     passes applied;
  3. RUN: `tiergate gate` of the model against itself on every class at once (--no-early-stop: every sample on
     every tier), in the same home (the compiles are reused): per class, the median of its timed single-sample
     calls, its load (session creation / library load) and cold first call, peak memory, and the largest
     |difference| of its outputs from onnxruntime's on the host (FP32, the same samples).

    PYTHONPATH=src .venv/bin/python bench/bench_tvm.py [--samples 24]
        [--pairs x86_64-cpu-tvm:x86_64-cpu-onnxruntime,arm64-cpu-tvm:arm64-cpu-onnxruntime] [--json OUT]

The arm64 figures are QEMU's (emulated latency is never a device's). Benchmarks print, they never fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))   # realmodels.kit: the model fetch and the text lines
PAIRS = "x86_64-cpu-tvm:x86_64-cpu-onnxruntime,arm64-cpu-tvm:arm64-cpu-onnxruntime"


def images(classes) -> None:
    """Every class's runtime image and the TVM compiler image, built or found (untimed)."""
    from tiergate.build import ensure_runtime_image
    from tiergate.build.compiling import ensure_compiler_image
    from tiergate.execution.engine import connect

    client = connect("local")
    try:
        for dc in classes:
            ensure_runtime_image(dc, client=client)
            if dc.compiled:
                ensure_compiler_image(dc, client=client)
    finally:
        client.close()


def compile_times(classes, model: Path) -> dict[str, dict]:
    from tiergate.artifact import load_artifact
    from tiergate.build.compiling import compiled

    artifact, out = load_artifact(model), {}
    for dc in classes:
        if not dc.compiled:
            continue
        t0 = time.monotonic()
        done = compiled(dc, artifact, input_shapes={"x": [None, 3, 48, 192]})
        meta = done.meta
        out[dc.name] = {"wall_s": time.monotonic() - t0, "reused": done.reused,
                        "passes_s": meta["compile_seconds"], "export_s": meta["export_seconds"],
                        "static_s": meta["static_seconds"], "import_s": meta["import_seconds"],
                        "passes": len(meta["passes"]), "library_bytes": (done.folder / "model.so").stat().st_size}
    return out


def gate(model: Path, data: Path, names: list[str]) -> dict:
    cmd = [sys.executable, "-m", "tiergate.cli.main", "gate", "--candidate", str(model), "--reference", str(model),
           "--data", str(data), "--targets", ",".join(names), "--json", "--no-early-stop"]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        raise SystemExit(f"bench_tvm: the gate exited {done.returncode}: {done.stderr[-2000:]}")
    decision = json.loads(done.stdout)
    decision["_wall_s"] = time.monotonic() - t0
    return decision


def run_figures(decision: dict, name: str, expected: np.ndarray, output: str) -> dict:
    folder = Path(decision["runs"][f"candidate/{name}"])
    result = json.loads((folder / "result.json").read_text())
    with np.load(folder / "outputs.npz") as npz:
        got = npz[output]
    device = result.get("device") or {}
    return {"median_ms": statistics.median(result["latencies_ns"]) / 1e6, "calls": len(result["latencies_ns"]),
            "load_ms": device.get("load_ms"), "first_ms": device.get("first_inference_ms"),
            "peak_mb": (device.get("peak_memory_bytes") or 0) / 2**20,
            "max_abs_diff": float(np.max(np.abs(got.astype(np.float64) - expected))),
            "same_argmax": bool((got.argmax(1) == expected.argmax(1)).all()), "machine": result["machine"],
            "versions": result["versions"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=24)
    p.add_argument("--pairs", default=PAIRS, help="TVM_CLASS:ONNXRUNTIME_CLASS,... (the same tier side by side)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    import onnxruntime as ort
    from realmodels.kit import fetch, text_lines
    from tiergate.targets import resolve

    pairs = [tuple(item.split(":")) for item in args.pairs.split(",")]
    names = [n for pair in pairs for n in pair]
    classes = resolve(names)
    model = fetch("paddleocr_cls")
    x, _ = text_lines(args.samples, seed=1)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name
    expected = session.run([output], {"x": x})[0].astype(np.float64)
    with tempfile.TemporaryDirectory(prefix="bench-tvm-") as tmp:
        data = Path(tmp) / "lines.npz"
        np.savez(data, x=x)                                 # no labels: the model against itself, drift only
        os.environ["TIERGATE_HOME"] = str(Path(tmp) / "home")
        t0 = time.monotonic()
        images(classes)
        print(f"images ready in {time.monotonic() - t0:.0f} s (untimed)", flush=True)
        compiles = compile_times(classes, model)
        decision = gate(model, data, names)
        runs = {name: run_figures(decision, name, expected, output) for name in names}
    print(f"\nPaddleOCR cls, {args.samples} text lines, one gate of every class: {decision['_wall_s']:.0f} s "
          f"(verdict {decision['verdict']})")
    header = f"{'tier class':<24} {'compile s':>9} {'passes':>6} {'ms/inference':>12} {'load ms':>8} " \
             f"{'first ms':>8} {'peak MB':>7} {'max|diff| vs ORT':>16}"
    print(header)
    print("-" * len(header))
    for tvm_name, ort_name in pairs:
        for name in (tvm_name, ort_name):
            c, r = compiles.get(name), runs[name]
            compile_text = f"{c['wall_s']:9.1f}" if c else f"{'-':>9}"
            passes = f"{c['passes']:6d}" if c else f"{'-':>6}"
            print(f"{name:<24} {compile_text} {passes} {r['median_ms']:12.3f} {r['load_ms']:8.1f} {r['first_ms']:8.2f} "
                  f"{r['peak_mb']:7.0f} {r['max_abs_diff']:16.2e}")
        ratio = runs[tvm_name]["median_ms"] / runs[ort_name]["median_ms"]
        print(f"  {tvm_name} / {ort_name}: {ratio:.2f}x per inference ({runs[tvm_name]['machine']}"
              f"{', emulated' if 'arm64' in tvm_name else ''})")
    for name, c in compiles.items():
        print(f"compile {name}: {c['wall_s']:.1f} s wall = make static {c['static_s']:.1f} + import {c['import_s']:.1f}"
              f" + tvm.compile {c['passes_s']:.1f} + export (LLVM object code, link) {c['export_s']:.1f} + container "
              f"and copies; library {c['library_bytes'] / 2**20:.1f} MiB")
    if args.json:
        args.json.write_text(json.dumps({"compile": compiles, "runs": runs, "gate_s": decision["_wall_s"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
