"""explain's time per tier on PaddleOCR cls (469 layers), this tree's code beside a baseline's, side by side.

    PYTHONPATH=src .venv/bin/python bench/bench_explain.py [--baseline-rev REV | --baseline-src DIR]
        [--samples 8] [--repeat 1] [--targets x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime] [MODEL]

The candidate is the one bench_explain_paddleocr.py makes (quantize_static QDQ, uint8 activations, int8 weights, per
tensor, calibrated on 32 random inputs in [-1, 1]), the data `--samples` random inputs. The baseline is the code of
git revision REV (default: the merge base with main, i.e. before this branch), exported with its containers/ and
targets/ into a temporary folder, or a src/ folder given. Each (code, repeat) runs `tiergate.execution.explain.explain`
in its own process, with the real DockerRunner (the runtime images are built once by the builder seam and shared) and
a fresh TIERGATE_HOME (no dump cache: every dump is made); the order alternates between repeats. Prints seconds per
tier (the dump in the tier's container and the pairing), the plan's share, the ratio this tree / baseline, and the
issue's budgets: x86 within 2x of 5.9 s, arm64 within 1.5x of 48 s (the figures measured before the new pairing)."""

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))   # modelkit
BUDGET = {"x86_64-cpu-onnxruntime": 2 * 5.9, "arm64-cpu-onnxruntime": 1.5 * 48.0}

CHILD = r"""
import json, sys, time
from pathlib import Path
t0 = time.monotonic()
from tiergate.execution.explain import explain
from tiergate.explain import plan
from tiergate.orchestrator.explain_ab import docker_runner
from tiergate.targets import resolve
cand, ref, data, targets, samples, work = sys.argv[1:7]
t1 = time.monotonic()
plan(Path(cand), Path(ref), Path(work))
plan_s = time.monotonic() - t1
t1 = time.monotonic()
result = explain(Path(cand), Path(ref), Path(data), resolve(targets), runner=docker_runner(), samples=int(samples))
print("RESULT " + json.dumps({"total": time.monotonic() - t1, "plan": plan_s, "targets": {
    name: {"seconds": item.seconds, "layers": len(item.layers), "first_divergent": item.first_divergent,
           "error": item.error, "machine": item.machine} for name, item in result.targets.items()}}))
"""


def baseline_tree(rev: str, folder: Path) -> Path:
    """src/, containers/ and targets/ of git revision `rev`, exported into `folder`; returns its src/."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src", "containers", "targets"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder / "src"


def run(src: Path, args, work: Path, candidate: Path, data: Path) -> dict:
    home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
    env = dict(os.environ, PYTHONPATH=str(src), TIERGATE_HOME=str(home))
    done = subprocess.run([sys.executable, "-c", CHILD, str(candidate), args.model, str(data), args.targets,
                           str(args.samples), str(Path(tempfile.mkdtemp(prefix="plan-", dir=work)))],
                          capture_output=True, text=True, env=env, timeout=1800)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"explain failed with {src}: {(done.stderr or done.stdout)[-2000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> int:
    import modelkit

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="/work/shared/models/ch_ppocr_mobile_v2.0_cls_infer.onnx")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--targets", default="x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime")
    p.add_argument("--baseline-rev", default="")
    p.add_argument("--baseline-src", default="")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-explain-") as tmp:
        work = Path(tmp)
        if args.baseline_src:
            base = Path(args.baseline_src)
        else:
            rev = args.baseline_rev or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
                                                      capture_output=True, text=True, check=True).stdout.strip()
            (work / "baseline").mkdir()
            base = baseline_tree(rev, work / "baseline")
            print(f"baseline: git revision {rev[:12]}")
        codes = {"baseline": base, "this tree": ROOT / "src"}
        rng = np.random.default_rng(0)
        x = rng.uniform(-1, 1, (32, 3, 48, 192)).astype(np.float32)
        candidate = modelkit.quantize_qdq(Path(args.model), work / "cls-int8.onnx", {"x": x})
        data = work / "eval.npz"
        np.savez(data, x=rng.uniform(-1, 1, (args.samples, 3, 48, 192)).astype(np.float32))
        runs: dict[str, list[dict]] = {name: [] for name in codes}
        for k in range(args.repeat):
            for name in (list(codes) if k % 2 == 0 else list(codes)[::-1]):
                t0 = time.monotonic()
                runs[name].append(run(codes[name], args, work, candidate, data))
                print(f"  run {k + 1} {name}: {time.monotonic() - t0:.1f} s wall", flush=True)
    tiers = list(runs["this tree"][0]["targets"])
    print(f"\nexplain on PaddleOCR cls, {args.samples} samples, median of {args.repeat} run(s) per code, "
          f"seconds per tier (the dump and the pairing):")
    print(f"{'tier':26s} {'baseline':>9s} {'this tree':>10s} {'ratio':>6s} {'budget':>7s}  layers paired, first divergent")
    for tier in tiers:
        old = statistics.median(r["targets"][tier]["seconds"] for r in runs["baseline"])
        new = statistics.median(r["targets"][tier]["seconds"] for r in runs["this tree"])
        budget = BUDGET.get(tier)
        last_old, last_new = runs["baseline"][-1]["targets"][tier], runs["this tree"][-1]["targets"][tier]
        verdict = "" if budget is None else ("within" if new <= budget else "OVER")
        print(f"{tier:26s} {old:9.1f} {new:10.1f} {new / old:6.2f} {budget or 0:7.1f}  {verdict}; "
              f"{last_old['layers']} -> {last_new['layers']}, {last_old['first_divergent']} -> "
              f"{last_new['first_divergent']} {last_new['error']}")
    for name, items in runs.items():
        print(f"{name}: plan {statistics.median(r['plan'] for r in items):.2f} s, whole explain "
              f"{statistics.median(r['total'] for r in items):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
