"""The PaddleOCR gate on a real model, measured side by side in one run, printed as ratios.

PaddleOCR's text-direction classifier (FP32, fetched from its pinned wheel rapidocr-onnxruntime==1.4.4, the
same cache as tests/realmodels) against its INT8 (QDQ, onnxruntime's static quantizer, calibrated on 64
rendered lines, seed 2), gated on --samples text lines (seed 1) rendered here from the fonts matplotlib ships,
upright and rotated 180 degrees, pre-processed as PaddleOCR does (tests/realmodels/kit.py).

  1. images: built (or found) first, untimed, by the builder `tiergate gate` uses;
  2. WARM gate: `tiergate gate ... --json` as a subprocess with a fresh TIERGATE_HOME (no saved run,
     description or decision): the wall time a user waits; its verdict and top-1 per tier;
  3. CACHE HIT: the same command again, unchanged (--repeats times, median);
  4. FLOOR, per tier: the bare runtime's time for the same inferences the gate makes (both models, every
     sample, intra-op threads = the class's, session creation included; batch = the class's [evaluation]
     batch where it batches (emulated classes: 64), else its batch_size) in a bare loop inside the tier's
     runtime image (arm64: under QEMU), plus one container start (a container that imports onnxruntime and
     exits; median of 3). floor = sum over tiers (the issue's definition); also shown spread over the host's
     cores (an ideal lower bound for a gate that runs tiers or shards in parallel), and the floor of the
     unbatched inferences (what the gate did before batching);
  5. emulated per-sample cost, unbatched (batch 1) versus batched (--batch, 64; the model's batch dim is
     dynamic) in the arm64 runtime image, on the same samples, and the largest difference between the
     batched outputs and the unbatched ones per sample.

    PYTHONPATH=src .venv/bin/python bench/bench_gate_paddleocr.py [--samples 400]
        [--targets x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime] [--repeats 5] [--batch 64] [--json OUT]
        [--baseline-src OTHER_CHECKOUT/src]

Before the speed-up the warm gate took 76.7 s and 78.2 s on 400 lines (x86_64 and emulated arm64); the
targets are a warm gate <= 40 s and a cache hit <= 0.3 s. Benchmarks print, they never fail on a threshold.
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
sys.path.insert(0, str(ROOT / "tests"))   # realmodels.kit: the model fetch, the text lines, the INT8 candidate
TIERGATE = [sys.executable, "-m", "tiergate.cli.main"]

# The bare loop, run inside a runtime image: per model, session creation, then every sample at batch 1
# (the loop timed whole, its first call included), then the same samples at the given batch.
BARE = r'''
import json, sys, time
import numpy as np
import onnxruntime as ort

spec = json.loads(sys.argv[1])
with np.load(spec["data"]) as npz:
    x = npz["x"][:spec["samples"]]
n, result = len(x), {"onnxruntime": ort.__version__, "machine": __import__("platform").machine()}
for name, path in spec["models"].items():
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level = spec["threads"], 1, 3
    t0 = time.perf_counter()
    session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
    load = time.perf_counter() - t0
    feed_name, names = session.get_inputs()[0].name, [o.name for o in session.get_outputs()]
    row = {"load_s": load}
    outputs = {}
    for batch in spec["batches"]:
        feeds = [np.ascontiguousarray(x[i:i + batch]) for i in range(0, n, batch)]
        t0 = time.perf_counter()
        outs = [session.run(names, {feed_name: f}) for f in feeds]
        row[f"batch{batch}_s"] = time.perf_counter() - t0
        outputs[batch] = [np.concatenate([o[k] for o in outs]) for k in range(len(names))]
    first = outputs[spec["batches"][0]]
    for batch in spec["batches"][1:]:
        row[f"batch{batch}_max_abs_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(outputs[batch], first))
        row[f"batch{batch}_top1_equal"] = bool(np.array_equal(outputs[batch][0].argmax(-1), first[0].argmax(-1)))
    result[name] = row
print("BARE " + json.dumps(result))
'''


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def gate(home: Path, candidate: Path, reference: Path, data: Path, targets: str,
         src: Path | None = None) -> tuple[float, dict]:
    """(wall seconds, its JSON) of one `tiergate gate --json` subprocess with TIERGATE_HOME=home (and tiergate
    from `src`, a checkout's src/ folder, when given: the baseline)."""
    cmd = TIERGATE + ["gate", "--candidate", str(candidate), "--reference", str(reference), "--data", str(data),
                      "--targets", targets, "--json"]
    env = dict(os.environ, TIERGATE_HOME=str(home))
    if src is not None:
        env["PYTHONPATH"] = str(src)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"tiergate gate failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return wall, json.loads(proc.stdout)


def docker_run(image: str, args: list[str], *, mount: Path | None = None,
               env: dict[str, str] | None = None) -> tuple[float, str]:
    """(wall seconds, stdout) of `docker run` of a runtime image with python3 as the entry point, confined as
    the gate's runs are (no network, read-only root, one CPU, nobody, the class's environment: QEMU_CPU)."""
    cmd = ["docker", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--cpus", "1",
           "--user", "65534:65534", "--entrypoint", "python3"]
    for name, value in (env or {}).items():
        cmd += ["-e", f"{name}={value}"]
    if mount is not None:
        cmd += ["-v", f"{mount}:/bench:ro"]
    t0 = time.perf_counter()
    proc = sh(cmd + [image, "-s", *args])
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"docker run {image} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return wall, proc.stdout


def container_start(image: str, repeats: int = 3, env: dict[str, str] | None = None) -> float:
    """Median wall seconds of a container of `image` that imports onnxruntime and exits."""
    return statistics.median(docker_run(image, ["-c", "import onnxruntime"], env=env)[0] for _ in range(repeats))


def bare_loop(image: str, work: Path, samples: int, threads: int, batches: list[int],
              env: dict[str, str] | None = None) -> dict:
    """The bare loop (BARE) in `image` over both models; its JSON."""
    spec = {"data": "/bench/lines.npz", "samples": samples, "threads": threads, "batches": batches,
            "models": {"reference": "/bench/reference.onnx", "candidate": "/bench/candidate.onnx"}}
    _, out = docker_run(image, ["/bench/bare.py", json.dumps(spec)], mount=work, env=env)
    line = next(ln for ln in out.splitlines() if ln.startswith("BARE "))
    return json.loads(line[5:])


def top1(doc: dict, dc: str) -> tuple[float, float]:
    """(candidate, reference) top-1 accuracy on one device class from the gate's JSON (NaN when absent)."""
    t = (doc.get("metrics", {}).get(dc, {}).get("task") or {}).get("top1_accuracy") or {}
    return float(t.get("candidate", "nan")), float(t.get("reference", "nan"))


def prepare(work: Path, samples: int) -> tuple[Path, Path, Path]:
    """(candidate, reference, data) in `work`, readable by the containers' user."""
    import shutil

    from realmodels import kit

    try:
        source = kit.fetch("paddleocr_cls")
    except kit.FetchError as exc:
        raise SystemExit(str(exc)) from None
    reference = work / "reference.onnx"
    shutil.copy(source, reference)
    x, labels = kit.text_lines(samples, seed=1)
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-q-") as q:
        candidate = work / "candidate.onnx"
        shutil.copy(kit.int8_calibrated(source, Path(q), kit.text_lines(64, seed=2)[0]), candidate)
    data = work / "lines.npz"
    np.savez(data, x=x, labels=labels)
    (work / "bare.py").write_text(BARE)
    work.chmod(0o755)
    for path in work.iterdir():
        path.chmod(0o644)
    return candidate, reference, data


def build(candidate: Path, reference: Path, classes) -> dict[str, dict]:
    """Per device class: the runtime image tag and whether the images were already there (the builder
    `tiergate gate` uses, on the same intake, so the gate finds them)."""
    from tiergate import orchestrator

    builder, out = orchestrator.DockerBuilder(), {}
    intakes = [orchestrator.intake(p, classes) for p in (candidate, reference)]
    for dc in classes:
        t0 = time.perf_counter()
        images = [builder.build(dc, item) for item in intakes]
        out[dc.name] = {"runtime_tag": images[0].runtime_tag, "reused": all(i.reused for i in images),
                        "seconds": time.perf_counter() - t0}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--targets", default="x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime")
    parser.add_argument("--repeats", type=int, default=5, help="cache-hit repetitions (median)")
    parser.add_argument("--batch", type=int, default=64, help="the batched emulated loop's batch size")
    parser.add_argument("--json", type=Path, default=None, help="save the figures here")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="another tiergate's src/ (e.g. a worktree of an older commit): its warm gate on the same "
                             "inputs, timed in the same run (a first gate builds its images, untimed)")
    args = parser.parse_args()
    from tiergate.targets import resolve

    classes = resolve(args.targets)
    cores = os.cpu_count() or 1
    figures: dict = {"samples": args.samples, "targets": [dc.name for dc in classes], "cores": cores,
                     "batch": args.batch}
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-") as tmp:
        work = Path(tmp) / "inputs"
        work.mkdir()
        t0 = time.perf_counter()
        candidate, reference, data = prepare(work, args.samples)
        figures["prepare_s"] = time.perf_counter() - t0
        figures["images"] = images = build(candidate, reference, classes)

        if args.baseline_src is not None:        # its images first (untimed), then a warm gate with a fresh home
            gate(Path(tmp) / "baseline-build", candidate, reference, data, args.targets, args.baseline_src)
            base_warm, base_doc = gate(Path(tmp) / "baseline-home", candidate, reference, data, args.targets,
                                       args.baseline_src)
            figures.update(baseline_warm_s=base_warm, baseline_verdict=base_doc["verdict"],
                           baseline_top1={dc.name: dict(zip(("candidate", "reference"), top1(base_doc, dc.name)))
                                          for dc in classes})
        home = Path(tmp) / "home"
        warm, doc = gate(home, candidate, reference, data, args.targets)
        hits = []
        for _ in range(args.repeats):
            wall, hit_doc = gate(home, candidate, reference, data, args.targets)
            hits.append(wall)
        hit = statistics.median(hits)
        figures.update(warm_s=warm, hit_s=hit, hits_s=hits, verdict=doc["verdict"],
                       warm_containers=doc.get("containers_started"), hit_containers=hit_doc.get("containers_started"),
                       hit_decision_cached=hit_doc.get("decision_cached"),
                       top1={dc.name: dict(zip(("candidate", "reference"), top1(doc, dc.name))) for dc in classes})

        tiers = {}
        for dc in classes:
            image = images[dc.name]["runtime_tag"]
            batches = [dc.batch_size] + ([args.batch] if args.batch != dc.batch_size else [])
            bare = bare_loop(image, work, args.samples, dc.threads, batches, env=dc.container_env)
            start = container_start(image, env=dc.container_env)
            models = {k: v for k, v in bare.items() if isinstance(v, dict)}
            infer = sum(m["load_s"] + m[f"batch{dc.batch_size}_s"] for m in models.values())
            infer_batched = sum(m["load_s"] + m[f"batch{args.batch}_s"] for m in models.values())
            tiers[dc.name] = {"image": image, "emulated": dc.emulated, "machine": bare["machine"],
                              "onnxruntime": bare["onnxruntime"], "batch": dc.batch_size, "threads": dc.threads,
                              "start_s": start, "bare_s": infer, "bare_batched_s": infer_batched, "models": models,
                              "gate_batches": dc.evaluation.batch == args.batch and args.batch > dc.batch_size}
        figures["tiers"] = tiers
    unbatched = sum(t["start_s"] + t["bare_s"] for t in tiers.values())
    floor = sum(t["start_s"] + (t["bare_batched_s"] if t["gate_batches"] else t["bare_s"]) for t in tiers.values())
    spread = floor / cores
    figures.update(floor_s=floor, floor_spread_s=spread, floor_unbatched_s=unbatched,
                   warm_over_floor=warm / floor, warm_over_floor_spread=warm / spread, hit_over_warm=hit / warm)

    n = args.samples
    print(f"PaddleOCR cls (rapidocr-onnxruntime==1.4.4) INT8 candidate vs FP32 reference; {n} rendered text lines "
          f"(half rotated 180 degrees); targets {args.targets}; {cores} cores")
    print(f"  inputs prepared (fetch, render {n}+64 lines, quantize) in {figures['prepare_s']:.1f} s; images "
          + ", ".join(f"{k} {'present' if v['reused'] else 'built'} ({v['seconds']:.1f} s)" for k, v in images.items()))
    print(f"  warm gate (images present, fresh TIERGATE_HOME)         {warm:8.2f} s   "
          f"(containers started {figures['warm_containers']})")
    print(f"  cache hit (same command again, median of {len(hits)})           {hit:8.3f} s   "
          f"({', '.join(f'{h:.3f}' for h in hits)}; containers started {figures['hit_containers']}, "
          f"decision cached {figures['hit_decision_cached']})")
    print(f"  floor per tier = bare runtime (load + {n} samples x 2 models, the gate's batch, threads = the "
          f"class's, in its runtime image) + one container start:")
    for name, t in tiers.items():
        where = "emulated (QEMU)" if t["emulated"] else "native"
        key = f"batch{args.batch if t['gate_batches'] else t['batch']}_s"
        bare = t["bare_batched_s"] if t["gate_batches"] else t["bare_s"]
        parts = ", ".join(f"{role} load {m['load_s']:.2f} + {m[key]:.2f} s" for role, m in t["models"].items())
        print(f"    {name:<26} {where:<15} bare {bare:6.2f} s at batch {key[5:-2]} ({parts}) + start "
              f"{t['start_s']:.2f} s = {bare + t['start_s']:6.2f} s   [onnxruntime {t['onnxruntime']}, {t['machine']}]")
    print(f"  floor (sum over tiers, one after the other)             {floor:8.2f} s")
    print(f"  floor spread over {cores} cores (floor / {cores}: ideal, tiers or shards in parallel) {spread:8.2f} s")
    print(f"  floor of the unbatched inferences (the gate before batching)  {unbatched:8.2f} s")
    print(f"  ratio warm / floor:                  {warm / floor:7.3f}   (warm / floor spread over cores: "
          f"{warm / spread:.3f})")
    print(f"  ratio cache hit / warm:              {hit / warm:7.4f}")
    if "baseline_warm_s" in figures:
        figures["warm_over_baseline"] = warm / figures["baseline_warm_s"]
        print(f"  baseline ({args.baseline_src}) warm gate {figures['baseline_warm_s']:.2f} s, verdict "
              f"{figures['baseline_verdict']}; ratio warm / baseline warm: {figures['warm_over_baseline']:.3f}")
        for name, acc in figures["baseline_top1"].items():
            print(f"    {name:<26} baseline top-1 candidate {acc['candidate']:.4f}, reference {acc['reference']:.4f}")
    for name, t in tiers.items():
        if not t["emulated"] and args.batch == t["batch"]:
            continue
        one, many = f"batch{t['batch']}", f"batch{args.batch}"
        b1 = sum(m[f"{one}_s"] for m in t["models"].values()) / (2 * n) * 1000
        bb = sum(m[f"{many}_s"] for m in t["models"].values()) / (2 * n) * 1000
        diff = max(m[f"{many}_max_abs_diff"] for m in t["models"].values())
        same = all(m[f"{many}_top1_equal"] for m in t["models"].values())
        label = "emulated" if t["emulated"] else "native"
        per = "; ".join(f"{role} {m[one + '_s'] / n * 1000:.2f} vs {m[many + '_s'] / n * 1000:.2f}"
                        for role, m in t["models"].items())
        print(f"  {label} per-sample cost on {name}: unbatched {b1:.2f} ms, batched ({args.batch}) {bb:.2f} ms, "
              f"ratio batched / unbatched {bb / b1:.3f}  ({per} ms); batched vs unbatched outputs: max abs diff "
              f"{diff:.3g}, top-1 {'identical' if same else 'DIFFERS'}")
        t["per_sample_ms"] = {"unbatched": b1, "batched": bb, "max_abs_diff": diff, "top1_equal": same}
    print(f"  gate verdict: {figures['verdict']}")
    for name, acc in figures["top1"].items():
        print(f"    {name:<26} top-1 candidate (INT8) {acc['candidate']:.4f}, reference (FP32) {acc['reference']:.4f}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
        print(f"  figures saved to {args.json}")


if __name__ == "__main__":
    main()
