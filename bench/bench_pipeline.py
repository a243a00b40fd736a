"""Benchmark of the whole pipeline, measured side by side in one run, printed as ratios.

  1. the gate cold (tiergate images removed, so runtime and artifact images are built)
     versus warm (images present, no saved results);
  2. an unchanged re-run (every run reused from the cache) versus a warm full run;
  3. the whole demo (four candidates, four device classes, registry, report) warm versus its
     unchanged re-run (every run and decision from the cache);
  4. the orchestrator's peak memory (max RSS of the `tiergate gate` process; containers are
     separate processes) at 1,000 versus 100,000 evaluation samples;
  5. with --baseline-src OTHER/src: this checkout's warm gate and unchanged re-run against another
     checkout's (e.g. the previous commit's, `git worktree add`), interleaved A B A B over --rounds
     fresh homes (images shared), medians and their ratio; --side-by-side-only skips 1-4.

Each measurement runs `tiergate gate` as a subprocess with its own TIERGATE_HOME, on the
demo's digits model (ONNX INT8 candidate and FP32 reference). Usage:

  .venv/bin/python bench/bench_pipeline.py [--targets x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime]
                                           [--skip-cold] [--baseline-src OTHER/src [--rounds 3]
                                           [--side-by-side-only]]

Step 1 removes every image whose repository starts with `tiergate/` except the base images.
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

ROOT = Path(__file__).resolve().parent.parent
TIERGATE = [sys.executable, "-m", "tiergate.cli.main"]


def gate(home: Path, demo, data: Path, targets: str, src: Path | None = None) -> tuple[float, dict]:
    """(wall seconds, its JSON) for one `tiergate gate` subprocess (tiergate from `src` when given)."""
    cmd = TIERGATE + ["gate", "--candidate", str(demo.candidate("onnx-int8-entropy").path),
                      "--reference", str(demo.reference_onnx), "--data", str(data), "--targets", targets, "--json"]
    env = dict(os.environ, TIERGATE_HOME=str(home))
    if src is not None:
        env["PYTHONPATH"] = str(src)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"tiergate gate failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return wall, json.loads(proc.stdout)


def time_demo(home: Path) -> float:
    """Wall seconds of one `tiergate demo` with its own TIERGATE_HOME."""
    env = dict(os.environ, TIERGATE_HOME=str(home))
    t0 = time.perf_counter()
    proc = subprocess.run(TIERGATE + ["demo"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tiergate demo failed ({proc.returncode}): {proc.stdout[-600:]} {proc.stderr[-400:]}")
    return time.perf_counter() - t0


def remove_tiergate_images() -> int:
    import docker

    client = docker.from_env()
    removed = 0
    for image in client.images.list():
        tags = [t for t in image.tags if t.startswith("tiergate/") and not t.startswith("tiergate/base:")]
        for tag in tags:
            client.images.remove(tag, force=True)
            removed += 1
    client.images.prune(filters={"dangling": True})
    return removed


def peak_memory(samples: int, demo, targets: str, work: Path) -> tuple[int, float]:
    """Peak RSS (MiB) of a gate on `samples` evaluation samples.

    A fresh bench process runs exactly one `tiergate gate` child, so RUSAGE_CHILDREN's
    max RSS there is that gate process's peak.
    """
    code = (
        "import json,sys; sys.path.insert(0, %r); from bench_pipeline import *; "
        "from tiergate.demo.models import build_demo_set, make_eval_npz; from pathlib import Path; "
        "demo = build_demo_set(Path(%r)); data = make_eval_npz(Path(%r), %d); "
        "wall, doc = gate(Path(%r), demo, data, %r); import resource; "
        "print(json.dumps([resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, wall]))"
    ) % (str(Path(__file__).parent), str(work / "models"), str(work / f"eval-{samples}.npz"), samples,
         str(work / f"home-{samples}"), targets)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    peak, wall = json.loads(out.strip().splitlines()[-1])
    return peak, wall


def side_by_side(demo, work: Path, targets: str, baseline: Path, rounds: int, hits: int = 5) -> None:
    """This checkout against `baseline` (another checkout's src/): warm gates in fresh homes and unchanged re-runs,
    interleaved so that a slower minute of the machine falls on both; medians and their ratio."""
    import statistics

    sides = {"this checkout": ROOT / "src", "baseline": baseline}
    for name, src in sides.items():                 # each side's images first (untimed)
        gate(work / f"prime-{name.replace(' ', '-')}", demo, demo.eval_data, targets, src)
    warm: dict[str, list[float]] = {name: [] for name in sides}
    hit: dict[str, list[float]] = {name: [] for name in sides}
    verdicts = {}
    for r in range(rounds):
        for name, src in sides.items():
            home = work / f"sbs-{r}-{name.replace(' ', '-')}"
            seconds, doc = gate(home, demo, demo.eval_data, targets, src)
            warm[name].append(seconds)
            verdicts.setdefault(name, doc["verdict"])
            hit[name] += [gate(home, demo, demo.eval_data, targets, src)[0] for _ in range(hits)]
    print(f"side by side ({rounds} rounds, {hits} re-runs each; targets {targets}; verdicts {verdicts}):")
    for label, figures in (("warm gate (fresh home, images present)", warm), ("unchanged re-run (cache hit)", hit)):
        ours, theirs = (statistics.median(figures[n]) for n in sides)
        print(f"  {label:<42} this {ours:7.3f} s   baseline {theirs:7.3f} s   ratio {ours / theirs:.3f}  "
              f"(this: {', '.join(f'{x:.3f}' for x in figures['this checkout'])}; "
              f"baseline: {', '.join(f'{x:.3f}' for x in figures['baseline'])})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime")
    parser.add_argument("--memory-target", default="x86_64-cpu-onnxruntime")
    parser.add_argument("--skip-cold", action="store_true")
    parser.add_argument("--baseline-src", type=Path, default=None, help="another checkout's src/ to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--side-by-side-only", action="store_true")
    args = parser.parse_args()
    from tiergate.demo.models import build_demo_set

    work = Path(tempfile.mkdtemp(prefix="tiergate-bench-"))
    demo = build_demo_set(work / "models")
    if args.baseline_src is not None:
        side_by_side(demo, work, args.targets, args.baseline_src.resolve(), args.rounds)
        if args.side_by_side_only:
            return
    rows = []
    if not args.skip_cold:
        removed = remove_tiergate_images()
        cold, _ = gate(work / "home-cold", demo, demo.eval_data, args.targets)
        rows.append(("pipeline cold (images built; %d images removed first)" % removed, cold))
    warm, full = gate(work / "home-warm", demo, demo.eval_data, args.targets)
    rerun, cached = gate(work / "home-warm", demo, demo.eval_data, args.targets)
    rows += [("pipeline warm (images present, runs executed)", warm),
             ("unchanged re-run (all runs from cache)", rerun)]
    print(f"targets: {args.targets}; eval samples: 450 (digits test split)")
    for label, seconds in rows:
        print(f"  {label:<60} {seconds:8.2f} s")
    if not args.skip_cold:
        print(f"  ratio warm / cold:                {warm / cold:.3f}")
    print(f"  ratio cached re-run / warm full:  {rerun / warm:.3f}  "
          f"(containers started: full {full['containers_started']}, re-run {cached['containers_started']})")
    demo_full = time_demo(work / "home-demo")
    demo_rerun = time_demo(work / "home-demo")
    print(f"tiergate demo (4 candidates x 2 device classes each, images present): full {demo_full:.2f} s, "
          f"unchanged re-run {demo_rerun:.2f} s")
    print(f"  ratio demo re-run / demo full:    {demo_rerun / demo_full:.3f}")
    small, small_wall = peak_memory(1_000, demo, args.memory_target, work)
    large, large_wall = peak_memory(100_000, demo, args.memory_target, work)
    print(f"orchestrator peak RSS on {args.memory_target}: 1,000 samples {small} MiB ({small_wall:.1f} s), "
          f"100,000 samples {large} MiB ({large_wall:.1f} s)")
    print(f"  ratio peak memory 100k / 1k:      {large / small:.3f}")


if __name__ == "__main__":
    main()
