"""A registry filled by the pipeline itself: real tiny ONNX models gated for real on x86_64 and emulated arm64
(real containers, the real QEMU), each decision recorded by `orchestrator.record`. Nothing here writes a metric:
the tests compute what the report must say from the stored run folders (outputs.npz, result.json) independently.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

import modelkit as mk
import gatekit
from tiergate import orchestrator
from tiergate.execution.explain import HostRunner, explain
from tiergate.policy import load_policy
from tiergate.registry import Registry
from tiergate.registry.store import file_sha256
from tiergate.targets import resolve

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
CLASSES = {"x86_64-cpu-onnxruntime": ("x86-server", False), "arm64-cpu-onnxruntime": ("cortex-a", True)}


def tiny_model(path: Path, weights: np.ndarray, bias: np.ndarray) -> Path:
    return mk.write(mk.linear(weights, bias, name="tiny"), path)


def populate(registry: Registry, tmp_path: Path) -> dict:
    """FP32 reference, a rejected candidate and a promoted candidate, each gated on both device classes; the
    rejected candidate's decision carries a recorded explanation (tiergate explain with the host runner on
    the x86 class: under a second)."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    w, b = rng.normal(size=(4, 3)), rng.normal(size=3)
    labels = (x @ w + b).argmax(1).astype(np.int64)        # the FP32 reference is right on every sample
    data = tmp_path / "eval.npz"
    np.savez(data, x=x, labels=labels)
    variants = {"fp32": (w, b), "v1": (rng.normal(size=w.shape), b),        # other weights: rejected
                "v2": (w + rng.normal(scale=1e-4, size=w.shape), b)}       # near-identical: promoted
    paths, shas, runs = {}, {}, {}
    for i, (name, (wv, bv)) in enumerate(variants.items()):
        paths[name] = tiny_model(tmp_path / "models" / f"{name}.onnx", wv, bv)
        shas[name] = file_sha256(paths[name])
        registry.add_artifact(paths[name], sha256=shas[name], model="digits", format="onnx",
                              precision="fp32" if name == "fp32" else "int8", fingerprint={"weights": name},
                              reference_sha=None if name == "fp32" else shas["fp32"],
                              parent_sha=None if name == "fp32" else shas["fp32"], at=T0 + timedelta(days=i))
    previous = os.environ.get("TIERGATE_HOME")
    os.environ["TIERGATE_HOME"] = str(tmp_path / "home")
    try:
        for name in variants:
            # real op profiles: the report's top ops per tier; every sample on both tiers (early decision off):
            # the cross-tier matrix compares runs of the same samples (a tier stopped early has a share of them)
            gate_run = gatekit.gate(paths[name], paths["fp32"], data, resolve(list(CLASSES)), load_policy(None),
                                    profile=True, early_stop=False)
            recorded = orchestrator.record(registry, gate_run, cost_tags={"billing": "edge-fleet"})
            runs[name] = {dc: folder for (role, dc), folder in gate_run.run_dirs.items() if role == "candidate"}
            runs[name]["verdict"] = gate_run.decision.verdict
            runs[name]["decision_id"] = recorded.id
        explained = explain(paths["v1"], paths["fp32"], data, resolve(["x86_64-cpu-onnxruntime"]), load_policy(None),
                            runner=HostRunner(), samples=16)
        registry.record_explanation(runs["v1"]["decision_id"], explained.to_json())
    finally:
        if previous is None:
            os.environ.pop("TIERGATE_HOME", None)
        else:
            os.environ["TIERGATE_HOME"] = previous
    return {"shas": shas, "labels": labels, "runs": runs, "paths": paths, "explained": explained}
