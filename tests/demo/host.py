"""Host-side runners and reference formulas for checking the demo set (tests only).

The formulas are written out here, independent of tiergate.metrics, as an oracle:
cosine = mean of per-sample cosine similarity, SQNR = 20*log10(|ref| / |ref - out|).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

GATE = {"min_accuracy_ratio": 0.99, "min_cosine": 0.997, "min_sqnr_db": 20.0}


def run_onnx(path: Path, images: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(["probs"], {"image": images})
    return out


def run_tflite(path: Path, images: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    (inp,) = interp.get_input_details()
    interp.resize_tensor_input(inp["index"], images.shape)
    interp.allocate_tensors()
    interp.set_tensor(inp["index"], images)
    interp.invoke()
    (out,) = [d for d in interp.get_output_details() if d["name"] == "probs"]
    return interp.get_tensor(out["index"]).copy()


def run_model(path: Path, images: np.ndarray) -> np.ndarray:
    return run_onnx(path, images) if Path(path).suffix == ".onnx" else run_tflite(path, images)


@dataclass(frozen=True)
class Measured:
    accuracy: float
    accuracy_ratio: float
    cosine: float
    sqnr_db: float

    def passes_gate(self) -> bool:
        return (self.accuracy_ratio >= GATE["min_accuracy_ratio"] and self.cosine >= GATE["min_cosine"]
                and self.sqnr_db >= GATE["min_sqnr_db"])


def measure(ref: np.ndarray, out: np.ndarray, labels: np.ndarray) -> Measured:
    ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
    ref_acc = float(np.mean(ref64.argmax(1) == labels))
    acc = float(np.mean(out64.argmax(1) == labels))
    cos = np.sum(ref64 * out64, 1) / (np.linalg.norm(ref64, axis=1) * np.linalg.norm(out64, axis=1))
    sqnr = 20 * np.log10(np.linalg.norm(ref64) / np.linalg.norm(ref64 - out64))
    return Measured(acc, acc / ref_acc, float(cos.mean()), float(sqnr))
