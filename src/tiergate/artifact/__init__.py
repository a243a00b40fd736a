"""Loading ONNX and TFLite artifacts into one description (see model.py)."""

from tiergate.artifact.model import Artifact, Node, QuantParams, TensorSpec

__all__ = ["Artifact", "Node", "QuantParams", "TensorSpec"]
