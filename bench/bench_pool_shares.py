"""An emulated tier over a work pool's workers (issue 46, item 3): the same gate on one machine, on a pool of one
worker and on a pool of two, measured side by side in one run.

A Prefect server on 127.0.0.1, the run-target deployment on a pool, worker A on a second dockerd (its own socket and
data root, the arm64 images loaded into it) and worker B on the machine's engine, both process workers of one
share at a time (tests/flows/flows_kit.py: what the pool test starts). The case: PP-OCRv4's recogniser, its
per-tensor INT8 against FP32, on --samples rendered lines (tests/realmodels/taskdata.py), the arm64 tier alone,
--no-early-stop, every gate in a fresh home (workers too):

  - one machine: the arm64 tier on this machine's engine (one container, its batched calls on the cores);
  - pool, 1 share: worker A runs every sample;
  - pool, 2 shares: A and B run half each (on this 2-core machine both share the same cores: this measures what
    the pool costs, not what it gains; on N machines the emulated time divides by N, below).

Printed: each gate's wall time, its ratio to the one-machine gate, the per-sample cost (seconds a sample, the
one-machine gate's arm64 run: eval_ms_per_sample) and the extrapolation to N workers of C cores:
T(N) = T_fixed + n x cost / (N x C), T_fixed from the 1-share pool gate less its samples' cost.

    PYTHONPATH=src .venv/bin/python bench/bench_pool_shares.py [--samples 160]
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "flows"))

import flows_kit as kit  # noqa: E402 - the server, the second engine and the process helpers the tests use

ARM = "arm64-cpu-onnxruntime"
POOL = "tiergate-bench-arm64-farm"


def worker(name: str, env: dict, docker_host: str | None, folder: Path):
    env = {**env, "TIERGATE_HOME": str(folder / f"home-{name}"), "PREFECT_WORKER_QUERY_SECONDS": "1"}
    env.pop("DOCKER_HOST", None)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    return kit.start([kit.PREFECT, "worker", "start", "--pool", POOL, "--type", "process", "--limit", "1",
                      "--name", f"{POOL}-{name}-{os.getpid()}"], folder / f"worker-{name}.log", env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=160)
    args = parser.parse_args()
    import docker

    from realmodels import kit as models, taskdata
    from tiergate import orchestrator, results
    from tiergate.build import ensure_runtime_image
    from tiergate.orchestration.deployments import deploy_run_target
    from tiergate.orchestration.gating import Remote, flow_seams
    from tiergate.orchestrator.seams import ThreadSteps
    from tiergate.policy import load_policy
    from tiergate.registry import Registry
    from tiergate.registry.intake import register_artifact
    from tiergate.request import GateRequest, RunOptions
    from tiergate.targets import resolve

    (dc,) = resolve([ARM])
    folder = Path(tempfile.mkdtemp(prefix="tiergate-bench-pool-"))
    source = models.fetch("ppocr_rec")
    shutil.copy(source, folder / "reference.onnx")
    x, texts = taskdata.rec_lines(args.samples, 1)
    data = folder / "lines.npz"
    np.savez(data, x=x, labels=np.array(texts))
    calibration, _ = taskdata.rec_lines(32, 7)
    shutil.copy(taskdata.rec_int8_per_tensor(source, folder, calibration), folder / "candidate.onnx")
    request = GateRequest(folder / "candidate.onnx", folder / "reference.onnx", str(data), (dc,), load_policy(None),
                          early_stop=False)
    times, docs = {}, {}

    def timed(name: str, seams=None, shards=None):
        os.environ["TIERGATE_HOME"] = str(folder / f"gate-{name}")
        t0 = time.perf_counter()
        run = orchestrator.gate(request, seams, RunOptions(shards=shards))
        times[name] = time.perf_counter() - t0
        docs[name] = run
        return run

    alone = timed("one machine")
    evaluations = {role: results.load(alone.run_dirs[(role, ARM)]).extra.get("evaluation", {})
                   for role in ("candidate", "reference")}
    evaluation = evaluations["candidate"]
    engine = kit.SecondEngine(Path(f"/tmp/tg-dockerd-{os.getpid()}-bench"))
    engine.folder.mkdir(exist_ok=True)
    workers = []
    try:
        engine.start()
        main_engine = docker.from_env()
        runtime = ensure_runtime_image(dc, client=main_engine)
        main_engine.close()
        engine.load_from_machine_engine(dc.base_image, runtime.tag)
        with kit.prefect_server(folder) as (api_url, env):
            for key in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH"):
                os.environ[key] = env[key]
            from prefect.settings import PREFECT_API_URL, temporary_settings

            with temporary_settings(updates={PREFECT_API_URL: api_url}):
                deploy_run_target(POOL)

                def pool_gate(name: str, shares: int) -> None:
                    """One pool gate with a registry and store of its own: a registry that holds the earlier
                    gate's decision would answer this one without running anything."""
                    where = folder / f"registry-{shares}"
                    where.mkdir()
                    registry_url, store = f"sqlite:///{where / 'registry.db'}", where / "store"
                    with Registry(registry_url, store) as registry:
                        register_artifact(registry, folder / "candidate.onnx", model="rec",
                                          reference=folder / "reference.onnx")
                    remote = Remote({ARM: POOL}, str(data), registry_url, str(store))
                    seams = contextvars.copy_context().run(flow_seams, remote, None, ThreadSteps())
                    timed(name, seams, shares)
                    print(f"  ({name}: {docs[name].containers_started} containers started)", flush=True)

                workers.append(worker("a", env, engine.host, folder))
                pool_gate("pool, 1 share (worker A)", 1)
                # fresh workers (homes of their own) for the 2 shares: worker A's home holds the 1-share gate's
                # runs, which would answer both shares without running anything
                kit.stop(workers.pop())
                workers.append(worker("a2", env, engine.host, folder))
                workers.append(worker("b2", env, None, folder))
                time.sleep(3)
                pool_gate("pool, 2 shares (workers A and B)", 2)
    finally:
        for proc in workers:
            kit.stop(proc)
        engine.stop()
        subprocess.run(["rm", "-rf", str(engine.folder)], check=False)
    base = times["one machine"]
    # a sample's cost: both models' calls (one thread's seconds), as each share runs both
    costs = {role: ev.get("eval_ms_per_sample", float("nan")) / 1000 for role, ev in evaluations.items()}
    cost = sum(costs.values())
    at_once = max(1, evaluation.get("eval_workers", 1) or 1)
    cores = os.cpu_count() or 1
    print(f"PP-OCRv4 rec per-tensor INT8 vs FP32, {args.samples} lines, {ARM} alone, --no-early-stop, fresh homes; "
          f"{cores} cores")
    for name, seconds in times.items():
        run = docs[name]
        print(f"  {name:<36} {seconds:8.2f} s   ratio to one machine {seconds / base:6.3f}   verdict "
              f"{run.decision.verdict}")
    fixed = times["pool, 1 share (worker A)"] - args.samples * cost / at_once
    print(f"  per-sample cost on {ARM} (the one-machine run's calls, one thread): "
          + ", ".join(f"{role} {c:.3f} s" for role, c in costs.items()) + f", {cost:.3f} s a sample in all")
    print(f"  extrapolation T(N workers of C cores) = {fixed:.1f} s + {args.samples} x {cost:.3f} s / (N x C): "
          + ", ".join(f"N={n}: {fixed + args.samples * cost / (n * cores):.0f} s" for n in (1, 2, 4, 8)))
    print(json.dumps({"times_s": times, "per_sample_s": cost, "fixed_s": fixed}))
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
