"""The TFLite side: FP32, FP16 and full-INT8 models from the same trained weights,
through TensorFlow's TFLiteConverter (TensorFlow imported only inside these functions).

The weights are frozen as constants in a tf.function with a named input signature,
so the input tensor is called `image` like the ONNX input; the converter names the
output `Identity`, which is renamed to `probs` in the flatbuffer. The input keeps a
dynamic batch (shape_signature [-1, 8, 8, 1]); runners resize it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from tiergate.demo.data import IMAGE_SHAPE, INPUT_NAME, OUTPUT_NAME
from tiergate.demo.train import CnnWeights, import_tensorflow

PRECISIONS = ("fp32", "fp16", "int8")


def _concrete_function(tf, w: CnnWeights):
    const = {name: tf.constant(getattr(w, name)) for name in CnnWeights.__dataclass_fields__}

    @tf.function(input_signature=[tf.TensorSpec([None, *IMAGE_SHAPE], tf.float32, name=INPUT_NAME)])
    def serve(image):
        h = tf.nn.relu(tf.nn.conv2d(image, const["conv_kernel"], 1, "SAME") + const["conv_bias"])
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = tf.reshape(h, [-1, const["fc1_kernel"].shape[0]])
        h = tf.nn.relu(tf.matmul(h, const["fc1_kernel"]) + const["fc1_bias"])
        return tf.nn.softmax(tf.matmul(h, const["fc2_kernel"]) + const["fc2_bias"])

    return serve.get_concrete_function()


def _configure(tf, converter, precision: str, representative: np.ndarray | None) -> None:
    if precision == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif precision == "int8":
        # Full integer kernels; the model's interface stays float32 (QUANTIZE/DEQUANTIZE
        # at the edges) so that one evaluation .npz feeds every candidate.
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.representative_dataset = _representative(representative)


def _representative(images: np.ndarray) -> Callable[[], Iterator[list[np.ndarray]]]:
    def gen():
        for i in range(len(images)):
            yield [images[i:i + 1]]
    return gen


def _rename_output(tf, flatbuffer: bytes) -> bytes:
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(flatbuffer))
    graph = model.subgraphs[0]
    (out_index,) = graph.outputs
    graph.tensors[out_index].name = OUTPUT_NAME.encode()
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def write_tflite(weights: CnnWeights, path: Path, precision: str,
                 representative: np.ndarray | None = None) -> Path:
    """Convert to `precision` (fp32, fp16 or int8; int8 needs representative images)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown TFLite precision {precision!r}")
    tf = import_tensorflow()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([_concrete_function(tf, weights)])
    _configure(tf, converter, precision, representative)
    with warnings.catch_warnings():   # "Statistics for quantized inputs were expected": float I/O is meant
        warnings.filterwarnings("ignore", message="Statistics for quantized inputs", category=UserWarning)
        flatbuffer = converter.convert()
    Path(path).write_bytes(_rename_output(tf, flatbuffer))
    return Path(path)
