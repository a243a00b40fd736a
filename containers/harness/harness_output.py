"""What a run leaves in its --out folder (tiergate_harness.py): outputs.npz and result.json (`write`), or
failed.json (`fail`: an artifact's child that failed, several artifacts per start), and its one line on stdout.
"""

from __future__ import annotations

import json
import os
import platform

import numpy as np

CONTAINER_ENV = "TIERGATE_IN_CONTAINER"   # set by the Docker backend: the run has its own container (and cgroup)

FAILED_FILE = "failed.json"


def artifact_bytes(model):
    """The artifact's size: in tiergate's container the model's folder holds it and its external data only."""
    if os.environ.get(CONTAINER_ENV):
        folder = os.path.dirname(os.path.abspath(model))
        return sum(os.path.getsize(p) for p in (os.path.join(folder, f) for f in os.listdir(folder))
                   if os.path.isfile(p))
    return os.path.getsize(model)


def write(args, runner, batch, n, outputs, latencies):
    import harness_cpu

    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, "outputs.npz"), **outputs)
    versions = {"numpy": np.__version__, "python": platform.python_version(), **runner.versions}
    result = {
        "runtime": args.runtime,
        "versions": versions,
        "machine": platform.machine(),
        "cpu": harness_cpu.cpu_info(),
        "threads": args.threads,
        "batch_size": batch,
        "n_samples": n,
        "warmup": args.warmup,
        "latencies_ns": [int(x) for x in latencies],
        "extra": {**runner.extra, "clock": "time.monotonic_ns",
                  **({"disabled_passes": sorted(args.disabled_passes)} if getattr(args, "disabled_passes", None)
                     else {})},
        "device": getattr(runner, "device", {}),
    }
    write_json(os.path.join(args.out, "result.json"), result)


def write_json(path, doc):
    """`doc` at `path`, whole or not at all (a reader never sees half a file)."""
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(path + ".tmp", path)


def fail(out, reason, code, **more):
    with open(os.path.join(out, FAILED_FILE), "w") as fh:
        json.dump({"reason": " ".join(reason.split())[:300], "code": code, **more}, fh)


def say(runner, n, latencies):
    evaluation = runner.extra.get("evaluation", {})
    batched = (f"; outputs in {evaluation['eval_calls']} calls of {evaluation['eval_batch']}"
               if evaluation.get("batched") else "")
    print(f"harness: {n} samples, {len(latencies)} timed calls on {platform.machine()}, "
          + (f"median {sorted(latencies)[len(latencies) // 2] / 1e6:.3f} ms" if latencies else "none timed")
          + batched, flush=True)
