"""The PaddleOCR gate on a real model, measured side by side in one run, printed as ratios to its floor.

PaddleOCR's text-direction classifier (FP32, fetched from its pinned wheel rapidocr-onnxruntime==1.4.4, the
same cache as tests/realmodels) against its INT8 with narrow calibration (QDQ, onnxruntime's static quantizer,
activation ranges from the 1st to the 99th percentile of 64 rendered lines, seed 2: tests/realmodels/kit.py
int8_narrow, a clear REJECT), gated on --samples text lines (seed 1) rendered here from the fonts matplotlib
ships, upright and rotated 180 degrees, pre-processed as PaddleOCR does.

  1. images: built (or found) first, untimed, by the builder `tiergate gate` uses;
  2. WARM gate: `tiergate gate ... --json --no-early-stop` as a subprocess with a fresh TIERGATE_HOME (no saved
     run, description or decision): the full evaluation's wall time, what a user waits; --warm-repeats times
     (default 3), each in a home of its own, between two floor measurements (6.);
  3. CACHE HIT: the same command again, unchanged (--repeats times, median);
  4. SECOND CANDIDATE: another INT8 of the same model (the usual calibration: kit.int8_calibrated) against the
     same reference, in the same home, --no-early-stop: the common CD case (the reference's runs are reused);
  5. EARLY: the narrow INT8 again, in another fresh home, with early decision as it is by default (on for
     emulated tiers): when its REJECT comes, and at which look; then a clearer INT8 (97th percentile ranges)
     the same way;
  6. FLOOR, per tier: the bare runtime's time for the same inferences the gate makes (both models, every
     sample, intra-op threads = the class's, session creation included; batch = the class's [evaluation] batch
     where it batches (emulated classes: 64), else its batch_size) in a bare loop inside the tier's runtime
     image (arm64: under QEMU), plus one container start (a container that imports onnxruntime and exits;
     median of 3). The floor is the issue's: the emulated tiers' bare runs spread over the host's cores (a gate
     shards them over the cores), plus the native tiers' bare runs: floor = sum(native) + sum(emulated) / cores.
     Measured before the first warm gate and after each (this host's speed drifts by several per cent within
     minutes, and one gate's wall time by 2-3 s run to run): each warm gate's ratio is to the mean of the floors
     either side of it, and the ratio printed is the median of those, each also shown. Also shown: every tier one
     after the other (sum), and with --unbatched the emulated per-sample cost at batch 1 against --batch (64).

    PYTHONPATH=src .venv/bin/python bench/bench_gate_paddleocr.py [--samples 400]
        [--targets x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime] [--repeats 5] [--warm-repeats 3]
        [--batch 64] [--unbatched]
        [--json OUT] [--baseline-src OTHER_CHECKOUT/src]

Targets (issue 28): warm / floor <= 1.10 (early decision off), the narrow INT8's early REJECT < 0.6 x floor.
Benchmarks print, they never fail on a threshold.
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
         src: Path | None = None, extra: tuple[str, ...] = ("--no-early-stop",)) -> tuple[float, dict]:
    """(wall seconds, its JSON) of one `tiergate gate --json` subprocess with TIERGATE_HOME=home (and tiergate
    from `src`, a checkout's src/ folder, when given: the baseline), with `extra` arguments (default: the full
    evaluation, early decision off)."""
    cmd = TIERGATE + ["gate", "--candidate", str(candidate), "--reference", str(reference), "--data", str(data),
                      "--targets", targets, "--json", *extra]
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
              env: dict[str, str] | None = None, data: str = "lines.npz",
              models: tuple[str, ...] = ("reference", "candidate")) -> dict:
    """The bare loop (BARE) in `image` over the models (work/NAME.onnx) on work/`data`; its JSON."""
    spec = {"data": f"/bench/{data}", "samples": samples, "threads": threads, "batches": batches,
            "models": {name: f"/bench/{name}.onnx" for name in models}}
    _, out = docker_run(image, ["/bench/bare.py", json.dumps(spec)], mount=work, env=env)
    line = next(ln for ln in out.splitlines() if ln.startswith("BARE "))
    return json.loads(line[5:])


def top1(doc: dict, dc: str) -> tuple[float, float]:
    """(candidate, reference) top-1 accuracy on one device class from the gate's JSON (NaN when absent)."""
    t = (doc.get("metrics", {}).get(dc, {}).get("task") or {}).get("top1_accuracy") or {}
    return float(t.get("candidate", "nan")), float(t.get("reference", "nan"))


def prepare(work: Path, samples: int) -> tuple[Path, Path, Path, Path, Path]:
    """(candidate, second candidate, clear candidate, reference, data) in `work`, readable by the containers'
    user."""
    import shutil

    from realmodels import kit

    try:
        source = kit.fetch("paddleocr_cls")
    except kit.FetchError as exc:
        raise SystemExit(str(exc)) from None
    reference = work / "reference.onnx"
    shutil.copy(source, reference)
    x, labels = kit.text_lines(samples, seed=1)
    calibration = kit.text_lines(64, seed=2)[0]
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-q-") as q:
        candidate, second, clear = work / "candidate.onnx", work / "second.onnx", work / "clear.onnx"
        shutil.copy(kit.int8_narrow(source, Path(q), calibration), candidate)
        shutil.copy(kit.int8_narrow(source, Path(q), calibration, percentile=97.0), clear)
        shutil.copy(kit.int8_calibrated(source, Path(q), calibration), second)
    data = work / "lines.npz"
    np.savez(data, x=x, labels=labels)
    (work / "bare.py").write_text(BARE)
    work.chmod(0o755)
    for path in work.iterdir():
        path.chmod(0o644)
    return candidate, second, clear, reference, data


def build(candidate: tuple[Path, ...], reference: Path, classes) -> dict[str, dict]:
    """Per device class: the runtime image tag and whether the images were already there (the builder
    `tiergate gate` uses, on the same intake, so the gate finds them)."""
    from tiergate import orchestrator

    builder, out = orchestrator.DockerBuilder(), {}
    intakes = [orchestrator.intake(p, classes) for p in (*candidate, reference)]
    for dc in classes:
        t0 = time.perf_counter()
        images = [builder.build(dc, item) for item in intakes]
        out[dc.name] = {"runtime_tag": images[0].runtime_tag, "reused": all(i.reused for i in images),
                        "seconds": time.perf_counter() - t0}
    return out


def looks(doc: dict) -> str:
    """Where each tier's early decision stopped, from the gate's JSON."""
    found = doc.get("early_stop") or {}
    return "; ".join(f"{name} stopped by {t['stopped_by']}'s REJECT after {t['look']} of {t['looks']} looks"
                     if t.get("stopped_by") else
                     f"{name} {t['verdict']} at look {t['look']} of {t['looks']} on {t['samples_used']} samples"
                     for name, t in found.items()) or "no early decision"


def floor_tiers(classes, images: dict, work: Path, args) -> dict:
    """Per tier: the bare loop (load + every sample x 2 models at the gate's batch) and one container start."""
    tiers = {}
    for dc in classes:
        image = images[dc.name]["runtime_tag"]
        gate_batch = dc.evaluation.batch if dc.evaluation.batch > dc.batch_size else dc.batch_size
        batches = [gate_batch] + ([dc.batch_size] if args.unbatched and gate_batch != dc.batch_size else [])
        bare = bare_loop(image, work, args.samples, dc.threads, batches, env=dc.container_env)
        start = container_start(image, env=dc.container_env)
        models = {k: v for k, v in bare.items() if isinstance(v, dict)}
        infer = sum(m["load_s"] + m[f"batch{gate_batch}_s"] for m in models.values())
        tiers[dc.name] = {"image": image, "emulated": dc.emulated, "machine": bare["machine"],
                          "onnxruntime": bare["onnxruntime"], "batch": dc.batch_size, "gate_batch": gate_batch,
                          "threads": dc.threads, "start_s": start, "bare_s": infer, "models": models}
    return tiers


def floor_of(tiers: dict, cores: int) -> tuple[float, float, float]:
    """(floor, native, emulated): the native tiers' bare runs and starts, plus the emulated ones' over the cores."""
    native = sum(t["start_s"] + t["bare_s"] for t in tiers.values() if not t["emulated"])
    emulated = sum(t["start_s"] + t["bare_s"] for t in tiers.values() if t["emulated"])
    return native + emulated / cores, native, emulated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--targets", default="x86_64-cpu-onnxruntime,arm64-cpu-onnxruntime")
    parser.add_argument("--repeats", type=int, default=5, help="cache-hit repetitions (median)")
    parser.add_argument("--warm-repeats", type=int, default=3,
                        help="warm gates (each in a fresh home), each between two floor measurements: the ratio is "
                             "the median of the gates' ratios to the mean of the floors either side")
    parser.add_argument("--batch", type=int, default=64, help="the batched emulated loop's batch size")
    parser.add_argument("--unbatched", action="store_true",
                        help="also time the bare loops at batch 1 (minutes under QEMU): per-sample cost batched/not")
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
        candidate, second, clear, reference, data = prepare(work, args.samples)
        figures["prepare_s"] = time.perf_counter() - t0
        figures["images"] = images = build((candidate, second, clear), reference, classes)

        if args.baseline_src is not None:        # its images first (untimed), then a warm gate with a fresh home
            old = ()                             # an older tiergate may not know --no-early-stop: its default
            gate(Path(tmp) / "baseline-build", candidate, reference, data, args.targets, args.baseline_src, old)
            base_warm, base_doc = gate(Path(tmp) / "baseline-home", candidate, reference, data, args.targets,
                                       args.baseline_src, old)
            figures.update(baseline_warm_s=base_warm, baseline_verdict=base_doc["verdict"],
                           baseline_top1={dc.name: dict(zip(("candidate", "reference"), top1(base_doc, dc.name)))
                                          for dc in classes})
        # the floor right before and right after each warm gate: this host's speed drifts by several per cent
        # within minutes (arm64's bare loop: 65.6 s before a warm gate, 68.9 s after it), so each gate is set
        # against the mean of the floors either side, and a gate's wall time varies by 2-3 s run to run (its
        # cores' share with the engine, QEMU's translations), so --warm-repeats gates, interleaved with floors,
        # give the median ratio
        floors = [floor_tiers(classes, images, work, args)]
        floor_all = [floor_of(floors[0], cores)[0]]
        warms, ratios = [], []
        for k in range(max(1, args.warm_repeats)):
            home = Path(tmp) / f"home-{k}"
            warm, doc = gate(home, candidate, reference, data, args.targets)
            floors.append(floor_tiers(classes, images, work, args))
            floor_all.append(floor_of(floors[-1], cores)[0])
            warms.append(warm)
            ratios.append(warm / ((floor_all[-2] + floor_all[-1]) / 2))
        before, after = floors[0], floors[-1]
        tiers = figures["tiers"] = before
        figures["tiers_after"] = after
        hits = []
        for _ in range(args.repeats):
            wall, hit_doc = gate(home, candidate, reference, data, args.targets)
            hits.append(wall)
        hit = statistics.median(hits)
        second_s, second_doc = gate(home, second, reference, data, args.targets)
        early_s, early_doc = gate(Path(tmp) / "home-early", candidate, reference, data, args.targets, extra=())
        clear_s, clear_doc = gate(Path(tmp) / "home-clear", clear, reference, data, args.targets, extra=())
        figures.update(warm_s=warm, hit_s=hit, hits_s=hits, verdict=doc["verdict"],
                       warm_containers=doc.get("containers_started"), hit_containers=hit_doc.get("containers_started"),
                       hit_decision_cached=hit_doc.get("decision_cached"),
                       top1={dc.name: dict(zip(("candidate", "reference"), top1(doc, dc.name))) for dc in classes},
                       second_s=second_s, second_verdict=second_doc["verdict"],
                       second_containers=second_doc.get("containers_started"),
                       second_reused=second_doc.get("cache_hits"),
                       second_top1={dc.name: top1(second_doc, dc.name)[0] for dc in classes},
                       early_s=early_s, early_verdict=early_doc["verdict"], early_looks=looks(early_doc),
                       early_checks_equal=_verdicts(early_doc, _decided(early_doc)) == _verdicts(doc, _decided(early_doc)),
                       clear_s=clear_s, clear_verdict=clear_doc["verdict"], clear_looks=looks(clear_doc),
                       clear_top1={dc.name: top1(clear_doc, dc.name)[0] for dc in classes})

    floor_before, native, emulated = floor_of(before, cores)
    floor_after = floor_all[-1]
    floor = statistics.median(floor_all)
    warm = statistics.median(warms)
    ratio = statistics.median(ratios)
    serial = native + emulated
    figures.update(floor_s=floor, floor_before_s=floor_before, floor_after_s=floor_after, floor_serial_s=serial,
                   floors_s=floor_all, warms_s=warms, warm_ratios=ratios, warm_over_floor=ratio,
                   early_over_floor=early_s / floor, clear_over_floor=clear_s / floor, second_over_floor=second_s / floor,
                   hit_over_warm=hit / warm)

    n = args.samples
    print(f"PaddleOCR cls (rapidocr-onnxruntime==1.4.4) INT8 with narrow calibration vs FP32; {n} rendered text "
          f"lines (half rotated 180 degrees); targets {args.targets}; {cores} cores")
    print(f"  inputs prepared (fetch, render {n}+64 lines, quantize twice) in {figures['prepare_s']:.1f} s; images "
          + ", ".join(f"{k} {'present' if v['reused'] else 'built'} ({v['seconds']:.1f} s)" for k, v in images.items()))
    print(f"  warm gate, full evaluation (fresh home, --no-early-stop)   {warm:8.2f} s   verdict {doc['verdict']} "
          f"(containers started {figures['warm_containers']}; median of {len(warms)}: "
          f"{', '.join(f'{w:.2f}' for w in warms)})")
    print(f"  cache hit (same command again, median of {len(hits)})            {hit:8.3f} s   "
          f"({', '.join(f'{h:.3f}' for h in hits)}; containers started {figures['hit_containers']}, "
          f"decision cached {figures['hit_decision_cached']})")
    print(f"  second candidate (int8_calibrated), same reference and home  {second_s:8.2f} s   verdict "
          f"{second_doc['verdict']} (containers started {figures['second_containers']}, runs reused "
          f"{figures['second_reused']})")
    print(f"  warm gate with early decision (fresh home, the default)   {early_s:8.2f} s   verdict "
          f"{early_doc['verdict']} ({figures['early_looks']}); failing checks of the classes it decided as the "
          f"full gate's: {figures['early_checks_equal']}")
    print(f"  the same, a clearer INT8 (97th percentile ranges)        {clear_s:8.2f} s   verdict "
          f"{clear_doc['verdict']} ({figures['clear_looks']})")
    print("  floor per tier = bare runtime (load + every sample x 2 models at the gate's batch, threads = the class's, "
          "in its runtime image) + one container start:")
    for name, t in tiers.items():
        where = "emulated (QEMU)" if t["emulated"] else "native"
        key = f"batch{t['gate_batch']}_s"
        parts = ", ".join(f"{role} load {m['load_s']:.2f} + {m[key]:.2f} s" for role, m in t["models"].items())
        print(f"    {name:<26} {where:<15} bare {t['bare_s']:6.2f} s at batch {t['gate_batch']} ({parts}) + start "
              f"{t['start_s']:.2f} s = {t['bare_s'] + t['start_s']:6.2f} s   [onnxruntime {t['onnxruntime']}, "
              f"{t['machine']}]")
    print(f"  floor = native {native:.2f} s + emulated {emulated:.2f} s / {cores} cores        {floor_before:8.2f} s   "
          f"(every tier one after the other: {serial:.2f} s)")
    print(f"  the same floor measured after each warm gate             "
          f"{', '.join(f'{f:.2f}' for f in floor_all[1:])} s   (emulated bare, the last: "
          f"{sum(t['bare_s'] for t in after.values() if t['emulated']):.2f} s)")
    print(f"  floor: the median of the {len(floor_all)}                             {floor:8.2f} s")
    print(f"  ratio warm / floor:                        {ratio:7.3f}   (the median of each gate's ratio to the "
          f"mean of the floors before and after it: {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"  ratio early decision / floor:              {early_s / floor:7.3f}   (the clearer INT8: "
          f"{clear_s / floor:.3f})")
    print(f"  ratio second candidate / floor:            {second_s / floor:7.3f}")
    print(f"  ratio cache hit / warm:                    {hit / warm:7.4f}")
    if "baseline_warm_s" in figures:
        figures["warm_over_baseline"] = warm / figures["baseline_warm_s"]
        print(f"  baseline ({args.baseline_src}) warm gate {figures['baseline_warm_s']:.2f} s, verdict "
              f"{figures['baseline_verdict']}; ratio warm / baseline warm: {figures['warm_over_baseline']:.3f}")
    for name, t in tiers.items():
        one = f"batch{t['batch']}"
        if one + "_s" not in next(iter(t["models"].values())) or t["gate_batch"] == t["batch"]:
            continue
        many = f"batch{t['gate_batch']}"
        b1 = sum(m[f"{one}_s"] for m in t["models"].values()) / (2 * n) * 1000
        bb = sum(m[f"{many}_s"] for m in t["models"].values()) / (2 * n) * 1000
        diff = max(m[f"{one}_max_abs_diff"] for m in t["models"].values())
        same = all(m[f"{one}_top1_equal"] for m in t["models"].values())
        print(f"  per-sample cost on {name}: unbatched {b1:.2f} ms, batched ({t['gate_batch']}) {bb:.2f} ms, ratio "
              f"{bb / b1:.3f}; outputs max abs diff {diff:.3g}, top-1 {'identical' if same else 'DIFFERS'}")
        t["per_sample_ms"] = {"unbatched": b1, "batched": bb, "max_abs_diff": diff, "top1_equal": same}
    for name, acc in figures["top1"].items():
        print(f"    {name:<26} top-1 narrow INT8 {acc['candidate']:.4f}, calibrated INT8 "
              f"{figures['second_top1'][name]:.4f}, clearer INT8 {figures['clear_top1'][name]:.4f} (on the samples "
              f"its early decision used), FP32 {acc['reference']:.4f}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
        print(f"  figures saved to {args.json}")


def _verdicts(doc: dict, classes: set | None = None) -> set:
    """The failing checks of a gate's JSON: (class, check) pairs (of `classes` only, when given)."""
    return {(c["device_class"], c["name"]) for c in doc.get("checks", [])
            if not c.get("passed") and (classes is None or c["device_class"] in classes)}


def _decided(doc: dict) -> set:
    """The classes an early decision decided (not stopped by another's REJECT)."""
    return {name for name, t in (doc.get("early_stop") or {}).items() if not t.get("stopped_by")}


if __name__ == "__main__":
    main()
