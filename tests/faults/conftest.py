"""Fault suite plumbing: the orchestrator's fakes, the real registry backends, a small classifier case."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
for sibling in ("pipeline", "registry"):
    if str(HERE.parent / sibling) not in sys.path:
        sys.path.append(str(HERE.parent / sibling))

from backends import BACKENDS, open_registry, postgres_server, s3_server  # noqa: E402,F401 - fixtures

import modelkit  # noqa: E402



def classifier(path: Path, weights: np.ndarray) -> Path:
    return modelkit.write(modelkit.linear(weights, softmax=True, output_name="probs"), path)


@pytest.fixture
def case(tmp_path, tiergate_home):
    """A reference, a good and a bad candidate (4 classes), 400 labelled samples (identical answers resolve 0.99)."""
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 4))
    x = rng.normal(size=(400, 8)).astype(np.float32)
    labels = (x @ w).argmax(1).astype(np.int64)
    data = tmp_path / "eval.npz"
    np.savez(data, x=x, labels=labels)
    return {"reference": classifier(tmp_path / "ref.onnx", w),
            "good": classifier(tmp_path / "good.onnx", w + rng.normal(0, 1e-4, w.shape)),
            "bad": classifier(tmp_path / "bad.onnx", rng.normal(size=w.shape)),
            "data": data, "x": x, "labels": labels, "home": tiergate_home, "tmp": tmp_path}


