"""Loading ONNX and TFLite artifacts into one description (see model.py).

`load_artifact(path)` detects the format from the file's content (the TFLite
flatbuffer identifier, else an ONNX protobuf), not from its suffix.
"""

from __future__ import annotations

from pathlib import Path

from tiergate.artifact.detect import detect_format, read_model_file
from tiergate.artifact.model import Artifact, Node, QuantParams, TensorSpec

__all__ = ["Artifact", "Node", "QuantParams", "TensorSpec", "load_artifact"]


def load_artifact(path: Path | str) -> Artifact:
    """Load an ONNX or TFLite model; unusable input raises InputError naming the file."""
    path = Path(path)
    data = read_model_file(path)
    if detect_format(path, data) == "tflite":
        from tiergate.artifact.tflite_loader import load_tflite

        return load_tflite(path, data)
    from tiergate.artifact.onnx_loader import load_onnx

    return load_onnx(path, data)
