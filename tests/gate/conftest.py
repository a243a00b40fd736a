"""Fixtures of the gate tests: device classes, saved-run outcomes and a tiny real classifier."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tiergate.gate import RunOutcome
from tiergate.results import TargetResult
from tiergate.targets import DeviceClass


def device_class(name: str, tier: str, execution: str = "native", cost_per_hour: float = 0.1) -> DeviceClass:
    arch = "arm64" if execution == "emulated" else "amd64"
    return DeviceClass(name=name, tier=tier, arch=arch, runtime="onnxruntime", runtime_version="1.31.1",
                       threads=1, batch_size=1, execution=execution, docker_host="local",
                       cost_per_hour=cost_per_hour)


@pytest.fixture
def device_classes() -> dict[str, DeviceClass]:
    return {
        "x86": device_class("x86", "x86-server", "native", 0.096),
        "arm": device_class("arm", "cortex-a", "emulated", 0.0084),
    }


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (shifted / shifted.sum(axis=-1, keepdims=True)).astype(np.float32)


def outcome(device: str, outputs: dict[str, np.ndarray] | None, *, latency_ms: float = 1.0, cov: float = 0.05,
            n_calls: int | None = None, emulated: bool = False, status: str = "ok", reason: str | None = None,
            seed: int = 0) -> RunOutcome:
    """A saved run: outputs plus per-call latencies drawn around latency_ms with the given CoV."""
    rng = np.random.default_rng(seed)
    n = n_calls if n_calls is not None else (len(next(iter(outputs.values()))) if outputs else 0)
    latencies = np.abs(rng.normal(latency_ms * 1e6, latency_ms * 1e6 * cov, n)).astype(np.int64).tolist()
    result = TargetResult(device_class=device, status=status, reason=reason, emulated=emulated,
                          latencies_ns=latencies if status == "ok" else [], n_samples=n)
    return RunOutcome(result, outputs if status == "ok" else None)


@pytest.fixture
def make_outcome():
    return outcome


@pytest.fixture
def classifier_data():
    """Logits of 600 samples, 10 classes, and labels the FP32 logits get right about 92% of the time."""
    rng = np.random.default_rng(42)
    logits = rng.normal(size=(600, 10)) * 3
    labels = logits.argmax(axis=1)
    flip = rng.random(600) < 0.08
    labels[flip] = rng.integers(0, 10, flip.sum())
    return logits, labels


@pytest.fixture(scope="session")
def digits_models(tmp_path_factory):
    """A real classifier on scikit-learn's digits: an FP32 ONNX model and its QDQ INT8 quantization."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    import modelkit as mk

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    clf = LogisticRegression(max_iter=300).fit(x[:1000], y[:1000])
    folder = tmp_path_factory.mktemp("digits")
    fp32 = mk.write(mk.linear(clf.coef_.T, clf.intercept_, softmax=True, output_name="probs", name="digits"),
                    folder / "digits-fp32.onnx")
    int8 = mk.quantize_qdq(fp32, folder / "digits-int8.onnx", {"x": x[:200]})
    return {"fp32": fp32, "int8": int8, "x": x[1000:], "labels": y[1000:]}


def run_onnx(path, x: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Run a model one sample per call with onnxruntime; outputs and per-call latencies in ns."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    outputs, latencies = [], []
    for _ in range(20):                                   # warm-up calls, not timed
        session.run(None, {"x": x[:1]})
    for i in range(len(x)):
        start = time.perf_counter_ns()
        outputs.append(session.run(None, {"x": x[i:i + 1]})[0])
        latencies.append(time.perf_counter_ns() - start)
    return np.concatenate(outputs), latencies


@pytest.fixture
def onnx_runner():
    return run_onnx


@pytest.fixture
def to_probs():
    return softmax
