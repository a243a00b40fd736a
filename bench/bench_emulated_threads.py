"""Calls at once under QEMU: threads of one emulated process against processes, side by side in one run.

An emulated onnxruntime tier makes its batched calls on several threads of one container (docs/execution.md,
"Batched calls at once"). This measures whether a call costs more per thread when another runs beside it in the
same QEMU process: PP-OCRv4's detector (the INT8 calibrated on blank pages, tests/realmodels/taskdata.py) on
--samples pages, in the arm64 class's runtime image (QEMU_CPU as the class says, one session, one intra-op thread,
the container's memory limit as the class's), three ways:

  A. one process, one thread, every page;
  B. one process, two threads claiming the calls in order (as the harness's workers do);
  C. two processes at once, half the pages each.

Printed: each way's wall time and the calls' own time per page (what one thread spends, as the harness's
`eval_ms_per_sample`), and the ratios B / A and C / A.

    PYTHONPATH=src .venv/bin/python bench/bench_emulated_threads.py [--samples 48] [--batch 8[,16...]]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_gate_paddleocr as paddle  # noqa: E402 - the image builder the gate uses

CLASS = "arm64-cpu-onnxruntime"
LOOP = r'''
import json, sys, threading, time
import numpy as np
import onnxruntime as ort
spec = json.loads(sys.argv[1])
with np.load("/w/data.npz") as npz:
    x = np.ascontiguousarray(npz["x"][spec["start"]:spec["stop"]])
opts = ort.SessionOptions()
opts.intra_op_num_threads, opts.inter_op_num_threads, opts.log_severity_level = 1, 1, 3
session = ort.InferenceSession("/w/model.onnx", sess_options=opts, providers=["CPUExecutionProvider"])
feed, names = session.get_inputs()[0].name, [o.name for o in session.get_outputs()]
session.run(names, {feed: x[:1]})
batch, calls, lock = spec["batch"], [], threading.Lock()
starts = iter(range(0, len(x), batch))
def work():
    while True:
        with lock:
            i = next(starts, None)
        if i is None:
            return
        t0 = time.perf_counter()
        session.run(names, {feed: x[i:i + batch]})
        calls.append(time.perf_counter() - t0)
t0 = time.perf_counter()
threads = [threading.Thread(target=work) for _ in range(spec["threads"])]
[t.start() for t in threads]
[t.join() for t in threads]
print("LOOP " + json.dumps({"pages": len(x), "wall_s": time.perf_counter() - t0, "call_s": sum(calls) / len(x)}))
'''


def loop(image: str, work: Path, dc, start: int, stop: int, threads: int, batch: int) -> dict:
    cmd = ["docker", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--cpus", str(threads),
           "-m", dc.limits.memory, "--user", "65534:65534", "--entrypoint", "python3", "-v", f"{work}:/w:ro"]
    for name, value in dc.container_env.items():
        cmd += ["-e", f"{name}={value}"]
    spec = {"start": start, "stop": stop, "threads": threads, "batch": batch}
    out = subprocess.run(cmd + [image, "-s", "/w/loop.py", json.dumps(spec)], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("LOOP "))[5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--batch", default="8", help="calls of this many pages; several, comma-separated (8,16), "
                                                     "are measured side by side in the one run")
    args = parser.parse_args()
    from realmodels import kit, taskdata
    from tiergate.targets import resolve

    dc = resolve(CLASS)[0]
    n, half = args.samples, args.samples // 2
    batches = [int(b) for b in str(args.batch).split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tiergate-bench-threads-") as tmp:
        work = Path(tmp)
        source = kit.fetch("ppocr_det")
        blank, _ = taskdata.det_pages(8, 3, blank=True)
        shutil.copy(taskdata.det_int8(source, work, blank, "blank"), work / "model.onnx")
        x, _ = taskdata.det_pages(n, 1)
        np.savez(work / "data.npz", x=x)
        (work / "loop.py").write_text(LOOP)
        work.chmod(0o755)
        for path in work.iterdir():
            path.chmod(0o644)
        image = paddle.build((work / "model.onnx",), work / "model.onnx", [dc])[dc.name]["runtime_tag"]
        for batch in batches:
            a = loop(image, work, dc, 0, n, 1, batch)
            b = loop(image, work, dc, 0, n, 2, batch)
            both: list[dict] = [{}, {}]
            runs = [threading.Thread(target=lambda k=k: both.__setitem__(k, loop(image, work, dc, k * half,
                                                                                 (k + 1) * half, 1, batch)))
                    for k in range(2)]
            for run in runs:
                run.start()
            for run in runs:
                run.join()
            c_call = sum(r["call_s"] * r["pages"] for r in both) / sum(r["pages"] for r in both)
            rows.append((batch, a, b, max(r["wall_s"] for r in both), c_call))
    print(f"PP-OCRv4 det INT8 under QEMU ({CLASS}, {dc.container_env}, memory {dc.limits.memory}), {n} pages")
    for batch, a, b, c_wall, c_call in rows:
        print(f" calls of {batch}")
        print(f"  A one process, one thread     wall {a['wall_s']:7.2f} s   calls {a['call_s']:.4f} s a page")
        print(f"  B one process, two threads    wall {b['wall_s']:7.2f} s   calls {b['call_s']:.4f} s a page")
        print(f"  C two processes, {half} pages each wall {c_wall:7.2f} s   calls {c_call:.4f} s a page")
        print(f"  ratio B / A (per page, per thread): {b['call_s'] / a['call_s']:.3f}")
        print(f"  ratio C / A (per page, per thread): {c_call / a['call_s']:.3f}")
    if len(rows) > 1:
        first = rows[0]
        for batch, a, b, _, _ in rows[1:]:
            print(f" calls of {batch} against calls of {first[0]}: one thread {a['call_s'] / first[1]['call_s']:.3f}, "
                  f"two threads {b['call_s'] / first[2]['call_s']:.3f} (per page)")


if __name__ == "__main__":
    main()
