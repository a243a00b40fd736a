"""A registry filled the way the pipeline fills it: real tiny ONNX models run with onnxruntime, real metrics.

The cortex-a (emulated arm64) outputs are the x86 outputs plus a small, seeded perturbation
standing in for cross-architecture drift; the tests compute what the report must say from
these arrays independently.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import onnxruntime as ort

import modelkit as mk
from tiergate import results
from tiergate.metrics import compare_outputs
from tiergate.registry import Check, NewRun, Registry
from tiergate.registry.store import file_sha256

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)
DATA_SHA = "d" * 64
CLASSES = {"x86_64-cpu-onnxruntime": ("x86-server", False), "arm64-cpu-onnxruntime": ("cortex-a", True)}


def tiny_model(path: Path, weights: np.ndarray, bias: np.ndarray) -> Path:
    return mk.write(mk.linear(weights, bias, name="tiny"), path)


def run_model(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def profiled_detail(i: int) -> dict:
    """A recorded decision's detail with the candidate's op profile per device class (gate --profile):
    Conv time grows with i, Relu stays."""
    metrics = {}
    for device_class, (tier, emulated) in CLASSES.items():
        profile = {"available": True, "source": "onnxruntime profiling JSON", "reason": "", "calls": 10,
                   "by_op_type": {"Conv": {"total_ms": 10.0 * (i + 1), "calls": 20, "nodes": 2},
                                  "Relu": {"total_ms": 2.0, "calls": 20, "nodes": 2}},
                   "nodes": []}
        metrics[device_class] = {"tier": tier, "emulated": emulated,
                                 "device": {"candidate": {"peak_memory_bytes": 60 * 1024 * 1024,
                                                          "op_profile": profile}}}
    return {"metrics": metrics}


def populate(registry: Registry, tmp_path: Path) -> dict:
    """FP32 reference, a rejected candidate and a promoted candidate, each run on two device classes."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    labels = rng.integers(0, 3, size=32)
    w, b = rng.normal(size=(4, 3)), rng.normal(size=3)
    variants = {"fp32": (w, b), "v1": (w + rng.normal(scale=0.5, size=w.shape), b),
                "v2": (w + rng.normal(scale=0.01, size=w.shape), b)}
    shas, outputs = {}, {}
    for i, (name, (wv, bv)) in enumerate(variants.items()):
        path = tiny_model(tmp_path / "models" / f"{name}.onnx", wv, bv)
        shas[name] = file_sha256(path)
        registry.add_artifact(path, sha256=shas[name], model="digits", format="onnx",
                              precision="fp32" if name == "fp32" else "int8", fingerprint={"weights": name},
                              reference_sha=None if name == "fp32" else shas["fp32"],
                              parent_sha=None if name == "fp32" else shas["fp32"], at=T0 + timedelta(days=i))
        native = run_model(path, x)
        outputs[name] = {"x86_64-cpu-onnxruntime": native,
                         "arm64-cpu-onnxruntime": native + rng.normal(scale=1e-6, size=native.shape).astype(np.float32)}
    for i, name in enumerate(variants):
        runs = []
        for device_class, (tier, emulated) in CLASSES.items():
            out = outputs[name][device_class]
            drift = compare_outputs(outputs["fp32"][device_class], out)
            metrics = {"accuracy": float(np.mean(out.argmax(1) == labels)), "cosine": drift.cosine,
                       "sqnr_db": drift.sqnr_db, "max_abs_error": drift.max_abs_error,
                       "latency_p50_ms": (40.0 if emulated else 0.5) + i, "latency_p99_ms": (60.0 if emulated else 0.9) + i,
                       "cost_per_1k": None if emulated else 0.001 * (i + 1), "emulated": emulated,
                       "peak_memory_mb": (300.0 if emulated else 60.0) + 10 * i, "load_ms": 5.0 + i,
                       "first_inference_ms": 1.0 + i, "artifact_mb": 0.5}
            result = results.TargetResult(device_class=device_class, status="ok", tier=tier, emulated=emulated,
                                          artifact_sha256=shas[name], image_id=f"sha256:{device_class}",
                                          data_sha256=DATA_SHA, latencies_ns=[500_000] * 5)
            folder = results.save(result, tmp_path / "results" / name / device_class, {"y": out})
            runs.append(NewRun.from_result(result, metrics, folder))
        verdict = {"fp32": "promote", "v1": "reject", "v2": "promote"}[name]
        registry.record_decision(shas[name], verdict, tiers=[t for t, _ in CLASSES.values()], runs=runs,
                                 detail=profiled_detail(i),
                                 reasons=["cosine too low"] if verdict == "reject" else [],
                                 checks=[Check("x86_64-cpu-onnxruntime", "x86-server", "cosine", 0.9, 0.997, ">=", verdict == "promote")],
                                 cost_tags={"billing": "edge-fleet"}, at=T0 + timedelta(days=i, hours=1))
    return {"shas": shas, "outputs": outputs, "labels": labels}
