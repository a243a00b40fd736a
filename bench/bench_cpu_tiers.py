"""What emulating a tier's CPU costs: PaddleOCR's direction classifier (FP32 and s8s8) on the native x86 tier and
on the emulated AVX2 tier (qemu-x86_64 -cpu Haswell-noTSX), side by side in one run, per-sample time batched (the
emulated tier computes outputs in calls of 64) against the native per-sample time, and the accuracy each tier gives.

    .venv/bin/python bench/bench_cpu_tiers.py [--lines 160] [--json out.json]

Each tier's runs are made by `tiergate gate --json` in a fresh TIERGATE_HOME (images built first, untimed); the
figures come from the saved run folders: `extra.evaluation.eval_ms_per_sample` (batched, emulated) and the mean of
`latencies_ns` (native, one sample a call). The model comes from its pinned wheel (tests/realmodels/kit.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
TIERGATE = [sys.executable, "-m", "tiergate.cli.main"]
NATIVE, EMULATED = "x86_64-cpu-onnxruntime", "x86_64-avx2-onnxruntime"


def gate(home: Path, candidate: Path, reference: Path, data: Path, targets: str) -> tuple[float, dict]:
    cmd = TIERGATE + ["gate", "-c", str(candidate), "-r", str(reference), "-d", str(data), "-t", targets, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=dict(os.environ, TIERGATE_HOME=str(home)), capture_output=True, text=True)
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"tiergate gate failed ({proc.returncode}): {proc.stderr[-800:]}")
    return time.perf_counter() - t0, json.loads(proc.stdout)


def per_sample_ms(run_folder: str) -> float:
    result = json.loads((Path(run_folder) / "result.json").read_text())
    evaluation = result.get("extra", {}).get("evaluation", {})
    if evaluation.get("batched") and "eval_ms_per_sample" in evaluation:
        return float(evaluation["eval_ms_per_sample"])
    return float(np.mean(result["latencies_ns"])) / 1e6 / max(result.get("batch_size", 1), 1)


def main() -> None:
    from realmodels import kit

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=160)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tiergate-bench-cpu-"))
    source = kit.fetch("paddleocr_cls")
    x, y = kit.text_lines(args.lines, seed=0)
    np.savez(work / "lines.npz", x=x, labels=y)
    candidate = kit.int8_s8s8(source, work, kit.text_lines(64, seed=1)[0])
    gate(work / "prime", candidate, source, work / "lines.npz", f"{NATIVE},{EMULATED}")      # images, untimed
    figures = {}
    for name in (NATIVE, EMULATED):
        wall, doc = gate(work / f"home-{name}", candidate, source, work / "lines.npz", name)
        runs = {key.split("/")[0]: folder for key, folder in doc["runs"].items()}
        figures[name] = {"wall_s": wall, "verdict": doc["verdict"],
                         "ms_per_sample": {role: per_sample_ms(folder) for role, folder in runs.items()},
                         "accuracy": {role: doc["metrics"][name]["accuracy"][role]["value"]
                                      for role in ("candidate", "reference")},
                         "cpu": doc["runtime"][name]["cpu"]["model"]}
    print(f"PaddleOCR cls, {args.lines} rendered text lines, s8s8 candidate vs FP32 reference")
    for name, f in figures.items():
        print(f"  {name:<26} {f['cpu']:<40} wall {f['wall_s']:6.1f} s  verdict {f['verdict']:<12} "
              f"top-1 s8s8 {f['accuracy']['candidate']:.2%} FP32 {f['accuracy']['reference']:.2%}")
        for role, ms in f["ms_per_sample"].items():
            print(f"      {role:<10} {ms:9.3f} ms per sample")
    for role in ("candidate", "reference"):
        ratio = figures[EMULATED]["ms_per_sample"][role] / figures[NATIVE]["ms_per_sample"][role]
        print(f"  ratio emulated AVX2 (batched) / native per sample, {role}: {ratio:.1f}x")
    print(f"  ratio emulated / native gate wall time: {figures[EMULATED]['wall_s'] / figures[NATIVE]['wall_s']:.1f}x")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
