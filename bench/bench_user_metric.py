"""The decision step alone with a user metric on PP-OCRv4's text detector (issue 46, item 1b), before and after.

The detector's probability maps for --samples pages (tests/realmodels/taskdata.py's rendered pages, 320 x 320) from
the host's onnxruntime, FP32 and an INT8 calibrated on other pages; the user metric is the issue's `text_iou`
(tests/realmodels/taskdata.py TEXT_IOU): the IoU of the map's text pixels (> 0.3) with the page's word boxes
(labels: page indices into a boxes file beside the metric), judged with max_drop = 0.05. The decision (tiergate.gate.evaluate on x86, as a gate's deciding step makes
it) is timed in a fresh process per variant:

  - whole: `text_iou_whole` returns one number for the whole set (called per bootstrap resample);
  - per-sample: `text_iou` returns each page's intersection and union ({"numerator", "denominator"}: one call per
    side);
  - none: no user metric (the rest of the decision: the detector's own mask IoU, agreement).

With --baseline-src OTHER/src the "whole" variant also runs on that tiergate (e.g. a checkout of main before
issue 46: a thread per call, at most 999 resamples).

    PYTHONPATH=src .venv/bin/python bench/bench_user_metric.py [--samples 160] [--baseline-src OTHER/src]
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


DECIDE = r'''
import json, sys, time
from pathlib import Path

import numpy as np

spec = json.loads(sys.argv[1])
from tiergate.gate import RunOutcome, evaluate
from tiergate.metrics.task import resolve
from tiergate.policy import load_policy
from tiergate.results import TargetResult
from tiergate.targets import resolve as classes

(dc,) = classes(["x86_64-cpu-onnxruntime"])
with np.load(spec["outputs"]) as npz:
    cand, ref, labels = npz["candidate"], npz["reference"], npz["labels"]

def outcome(out):
    result = TargetResult(device_class=dc.name, status="ok", latencies_ns=[1000] * len(out), n_samples=len(out))
    return {dc.name: RunOutcome(result, {spec["output"]: out})}

policy = load_policy(spec["policy"])
metrics = resolve([spec["metric"]] if spec["metric"] else [], policy)
t0 = time.perf_counter()
decision = evaluate(outcome(cand), outcome(ref), {dc.name: dc}, policy, labels, metrics=metrics)
seconds = time.perf_counter() - t0
check = next((c for c in decision.checks if c.name.startswith("text_iou")), None)
print("DECIDED " + json.dumps({"seconds": seconds, "verdict": decision.verdict,
                               "check": None if check is None else {"value": check.value, "interval": [
                                   check.interval.low, check.interval.high, check.interval.method]}}))
'''


def outputs(work: Path, samples: int) -> tuple[Path, str]:
    """The detector's maps (FP32 and INT8) on the pages, with the page indices as labels; (file, output name)."""
    import onnxruntime as ort

    from realmodels import kit, taskdata

    source = kit.fetch("ppocr_det")
    x, boxes = taskdata.det_pages(samples, 1)
    taskdata.text_iou_metric(work, boxes)
    calibration, _ = taskdata.det_pages(16, 7)
    int8 = taskdata.det_int8(source, work, calibration, "good")
    maps, name = {}, ""
    for role, model in (("reference", source), ("candidate", int8)):
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        name = session.get_outputs()[0].name
        maps[role] = np.concatenate([session.run([name], {"x": x[i:i + 8]})[0] for i in range(0, samples, 8)])
    path = work / "maps.npz"
    np.savez(path, labels=np.arange(samples, dtype=np.int64), **maps)
    return path, name


def decide(work: Path, maps: Path, output: str, metric: str | None, src: Path) -> dict:
    policy = work / f"policy-{metric}.toml"
    policy.write_text(f"[metrics.{metric}]\nmax_drop = 0.05\n" if metric else "")
    spec = {"outputs": str(maps), "output": output, "policy": str(policy),
            "metric": f"{work / 'metrics.py'}:{metric}" if metric else None}
    env = dict(os.environ, PYTHONPATH=str(src))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", DECIDE, json.dumps(spec)], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("DECIDED "))
    return {**json.loads(line[8:]), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--baseline-src", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-metric-") as tmp:
        work = Path(tmp)
        maps, output = outputs(work, args.samples)
        rows = [("after", "per-sample", "text_iou", ROOT / "src"), ("after", "whole", "text_iou_whole", ROOT / "src"),
                ("after", "none", None, ROOT / "src")]
        if args.baseline_src is not None:
            rows.append(("before", "whole", "text_iou_whole", args.baseline_src))
        print(f"PP-OCRv4 det, {args.samples} pages of 320 x 320, INT8 vs FP32 on x86: the decision step alone "
              f"(tiergate.gate.evaluate, a fresh process each), user metric text_iou with max_drop = 0.05")
        for when, form, metric, src in rows:
            found = decide(work, maps, output, metric, src)
            if "error" in found:
                print(f"  {when:<6} {form:<10} error: {found['error']}")
                continue
            check = found["check"] or {}
            interval = check.get("interval") or [float("nan")] * 3
            print(f"  {when:<6} {form:<10} decision {found['seconds']:8.2f} s  verdict {found['verdict']:<12} "
                  f"text_iou difference {check.get('value', float('nan')):.4f} [{interval[0]:.4f}, {interval[1]:.4f}] "
                  f"({interval[2]})" if check else
                  f"  {when:<6} {form:<10} decision {found['seconds']:8.2f} s  verdict {found['verdict']}")


if __name__ == "__main__":
    main()
