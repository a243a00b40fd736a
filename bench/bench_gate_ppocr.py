"""Real-size models on an emulated tier (issue 46): PP-OCRv4's text detector and recogniser, measured side by side
in one run, printed as ratios to their floor.

The models ship in rapidocr-onnxruntime==1.4.4 (the same cache as tests/realmodels): the detector (4.7 MB, pages of
320 x 320) and the CTC recogniser (10.9 MB, lines of 48 x 320). The inputs and truth are tests/realmodels/taskdata.py's
(rendered pages with their word boxes as COCO labels, rendered lines with their texts); the INT8 candidates are
onnxruntime's own quantizers: the detector calibrated on blank pages (its map is all zero: a clear REJECT by
text-box IoU) and the recogniser with per-tensor weights (its lines come out garbled: a clear REJECT by CER).
Each case, x86_64 + emulated arm64, --samples of them (160), images built first, every gate in a fresh home:

  1. WARM gate, full evaluation (--no-early-stop): what a user waits when every sample is run;
  2. EARLY: the same gate as by default (early decision on the emulated tier): x86 rejects in seconds and its final
     REJECT stops arm64;
  3. CACHE HIT: the warm gate's command again, unchanged (the fast path), median of --repeats; and the emulated
     tier alone as by default (early_spending "auto": on 160 samples Kim-DeMets' alpha t^2, 2 looks, a clear case
     decided at the first, on 80 of 160);
  4. FLOOR, per tier: the bare runtime's time for the inferences the gate makes (both models, every sample, in the
     tier's runtime image, at the batch the gate's harness used: read from its runs), session creation and one
     container start included; floor = the native tiers' + the emulated tiers' / the cores (bench_gate_paddleocr);
  5. the per-sample cost on each tier (bare, seconds a sample) and the emulated / native ratio.
  6. each run of the warm gate (from its home's result.json): tier, wall, the batched calls' own time per sample (one
     thread's), their batch and how many ran at once: where the warm gate sits above its floor.

    PYTHONPATH=src .venv/bin/python bench/bench_gate_ppocr.py [--samples 160] [--models det,rec] [--repeats 3]
        [--json OUT]

Targets (issue 46): warm / floor <= 1.15, early REJECT / floor <= 0.3, cache hit <= 0.3 s. Benchmarks print, they
never fail on a threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_gate_paddleocr as paddle  # noqa: E402 - its gate, docker and bare-loop helpers (one home for them)

TARGETS = "x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime"


def prepare(work: Path, kind: str, samples: int) -> dict:
    """The case's reference.onnx, candidate.onnx and data.npz in `work` (readable by the containers' user)."""
    from realmodels import kit, taskdata

    work.mkdir(parents=True)
    source = kit.fetch("ppocr_det" if kind == "det" else "ppocr_rec")
    shutil.copy(source, work / "reference.onnx")
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-q-") as q:
        if kind == "det":
            x, boxes = taskdata.det_pages(samples, 1)
            (work / "words.json").write_text(taskdata.coco(boxes))
            np.savez(work / "data.npz", x=x, labels=np.array("words.json"))
            blank, _ = taskdata.det_pages(8, 3, blank=True)
            shutil.copy(taskdata.det_int8(source, Path(q), blank, "blank"), work / "candidate.onnx")
        else:
            x, texts = taskdata.rec_lines(samples, 1)
            np.savez(work / "data.npz", x=x, labels=np.array(texts))
            calibration, _ = taskdata.rec_lines(32, 7)
            shutil.copy(taskdata.rec_int8_per_tensor(source, Path(q), calibration), work / "candidate.onnx")
    (work / "bare.py").write_text(paddle.BARE)
    work.chmod(0o755)
    for path in work.iterdir():
        path.chmod(0o644)
    return {"candidate": work / "candidate.onnx", "reference": work / "reference.onnx", "data": work / "data.npz"}


def gate_batches(home: Path) -> dict[tuple[str, str], int]:
    """(device class, artifact sha256) -> the batch the gate's harness made its outputs in, from its runs."""
    found = {}
    for result in (home / "runs").glob("*/result.json"):
        doc = json.loads(result.read_text())
        evaluation = (doc.get("extra") or {}).get("evaluation") or {}
        batch = evaluation.get("eval_batch") if evaluation.get("batched") else evaluation.get("latency_batch")
        if batch:
            found[(doc["device_class"], doc["artifact_sha256"])] = int(batch)
    return found


def gate_runs(home: Path, shas: dict[str, str]) -> list[dict]:
    """Each run the warm gate made, in start order: tier, role, start (s after the first), wall, the batched calls'
    own time per sample (one thread's), the batch and the calls at once (extra.evaluation)."""
    from datetime import datetime

    roles = {sha: role for role, sha in shas.items()}
    found = []
    for result in (home / "runs").glob("*/result.json"):
        doc = json.loads(result.read_text())
        ev = (doc.get("extra") or {}).get("evaluation") or {}
        found.append({"tier": doc["device_class"], "role": roles.get(doc["artifact_sha256"], "?"),
                      "started": datetime.fromisoformat(doc["started_at"]).timestamp(), "wall_s": doc.get("wall_s"),
                      "ms_per_sample": ev.get("eval_ms_per_sample"), "batch": ev.get("eval_batch"),
                      "at_once": ev.get("eval_at_once"), "n": doc.get("n_samples")})
    first = min((r["started"] for r in found), default=0.0)
    for r in found:
        r["started"] -= first
    return sorted(found, key=lambda r: r["started"])


def case(kind: str, samples: int, repeats: int, tmp: Path, classes) -> dict:
    from tiergate.hashing import file_sha256

    cores = os.cpu_count() or 1
    work = tmp / kind
    t0 = time.perf_counter()
    files = prepare(work, kind, samples)
    figures: dict = {"prepare_s": time.perf_counter() - t0}
    figures["images"] = images = paddle.build((files["candidate"],), files["reference"], classes)
    args = (files["candidate"], files["reference"], files["data"], TARGETS)
    warm, doc = paddle.gate(tmp / f"{kind}-home", *args)
    hits = [paddle.gate(tmp / f"{kind}-home", *args)[0] for _ in range(repeats)]
    early, early_doc = paddle.gate(tmp / f"{kind}-home-early", *args, extra=())
    arm = [dc.name for dc in classes if dc.emulated]        # the emulated tier alone, as by default: its own looks
    alone, alone_doc = paddle.gate(tmp / f"{kind}-home-alone", *args[:3], ",".join(arm), extra=())
    figures.update(warm_s=warm, verdict=doc["verdict"], hit_s=statistics.median(hits), hits_s=hits,
                   early_s=early, early_verdict=early_doc["verdict"], early_looks=paddle.looks(early_doc),
                   alone_s=alone, alone_verdict=alone_doc["verdict"], alone_looks=paddle.looks(alone_doc),
                   warm_containers=doc.get("containers_started"),
                   failing=sorted(paddle._verdicts(doc)), early_failing=sorted(paddle._verdicts(early_doc)))
    batches = gate_batches(tmp / f"{kind}-home")
    shas = {role: file_sha256(files[role]) for role in ("reference", "candidate")}
    figures["runs"] = gate_runs(tmp / f"{kind}-home", shas)
    tiers = {}
    for dc in classes:
        image = images[dc.name]["runtime_tag"]
        bare = {}
        for role, sha in shas.items():           # each model at the batch the gate's harness used for it
            batch = batches.get((dc.name, sha), dc.batch_size)
            loop = paddle.bare_loop(image, work, samples, dc.threads, [batch], env=dc.container_env,
                                    data="data.npz", models=(role,))
            bare[role] = {"batch": batch, "load_s": loop[role]["load_s"], "infer_s": loop[role][f"batch{batch}_s"]}
        start = paddle.container_start(image, env=dc.container_env)
        total = sum(m["load_s"] + m["infer_s"] for m in bare.values())
        tiers[dc.name] = {"emulated": dc.emulated, "start_s": start, "bare_s": total, "models": bare,
                          "per_sample_s": {role: m["infer_s"] / samples for role, m in bare.items()}}
    native = sum(t["start_s"] + t["bare_s"] for t in tiers.values() if not t["emulated"])
    emulated = sum(t["start_s"] + t["bare_s"] for t in tiers.values() if t["emulated"])
    floor = native + emulated / cores
    figures.update(tiers=tiers, floor_s=floor, floor_serial_s=native + emulated, warm_over_floor=warm / floor,
                   early_over_floor=early / floor, alone_over_floor=alone / floor,
                   hit_over_warm=figures["hit_s"] / warm, cores=cores)
    return figures


def report(kind: str, samples: int, f: dict) -> None:
    name = {"det": "PP-OCRv4 det (320 x 320 pages, INT8 calibrated on blank pages)",
            "rec": "PP-OCRv4 rec (48 x 320 lines, INT8 per-tensor weights)"}[kind]
    print(f"{name} vs FP32; {samples} samples; {TARGETS}; {f['cores']} cores; inputs prepared in "
          f"{f['prepare_s']:.1f} s; images " + ", ".join(f"{k} {'present' if v['reused'] else 'built'}"
                                                         for k, v in f["images"].items()))
    print(f"  warm gate, full evaluation (fresh home, --no-early-stop) {f['warm_s']:8.2f} s   verdict {f['verdict']} "
          f"(failing: {', '.join(f'{c} {n}' for c, n in f['failing']) or 'none'})")
    print(f"  warm gate, early decision (fresh home, the default)      {f['early_s']:8.2f} s   verdict "
          f"{f['early_verdict']} ({f['early_looks']})")
    print(f"  the emulated tier alone, early decision (its own looks)   {f['alone_s']:8.2f} s   verdict "
          f"{f['alone_verdict']} ({f['alone_looks']})")
    print(f"  cache hit (the warm command again, median of {len(f['hits_s'])})          {f['hit_s']:8.3f} s   "
          f"({', '.join(f'{h:.3f}' for h in f['hits_s'])})")
    for r in f["runs"]:
        print(f"    run {r['role']:<9} on {r['tier']:<26} from {r['started']:6.1f} s, {r['wall_s'] or 0:7.1f} s wall; "
              f"calls {r['ms_per_sample'] or 0:8.1f} ms a sample at batch {r['batch']}, {r['at_once']} at once")
    for dc, t in f["tiers"].items():
        parts = ", ".join(f"{role} load {m['load_s']:.2f} + {m['infer_s']:.2f} s at batch {m['batch']}"
                          for role, m in t["models"].items())
        print(f"    {dc:<26} {'emulated' if t['emulated'] else 'native':<9} bare {t['bare_s']:8.2f} s ({parts}) + "
              f"start {t['start_s']:.2f} s")
    print(f"  floor = native + emulated / {f['cores']} cores                  {f['floor_s']:8.2f} s   (one after the "
          f"other: {f['floor_serial_s']:.2f} s)")
    print(f"  ratio warm / floor:          {f['warm_over_floor']:7.3f}   (target <= 1.15)")
    print(f"  ratio early REJECT / floor:  {f['early_over_floor']:7.3f}   (target <= 0.3)")
    print(f"  ratio emulated tier alone, early / floor: {f['alone_over_floor']:7.3f}")
    print(f"  ratio cache hit / warm:      {f['hit_over_warm']:7.4f}")
    native = next((t for t in f["tiers"].values() if not t["emulated"]), None)
    for dc, t in f["tiers"].items():
        for role, cost in t["per_sample_s"].items():
            ratio = f" ({cost / native['per_sample_s'][role]:.0f} x native)" if t["emulated"] and native else ""
            print(f"  per-sample cost, {role:<9} on {dc:<26} {cost:8.3f} s a sample{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=160)
    parser.add_argument("--models", default="det,rec")
    parser.add_argument("--repeats", type=int, default=3, help="cache-hit repetitions (median)")
    parser.add_argument("--json", type=Path, default=None, help="save the figures here")
    args = parser.parse_args()
    from tiergate.targets import resolve

    classes = resolve(TARGETS)
    figures = {}
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-ppocr-") as tmp:
        for kind in [m for m in args.models.split(",") if m]:
            figures[kind] = case(kind, args.samples, args.repeats, Path(tmp), classes)
            report(kind, args.samples, figures[kind])
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1, default=str))
        print(f"  figures saved to {args.json}")


if __name__ == "__main__":
    main()
