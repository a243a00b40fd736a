"""The ONNX side: the FP32 graph written from the trained weights with onnx.helper, and
its INT8 QDQ variants made by onnxruntime.quantization.quantize_static.

The ONNX graph takes the same NHWC input as the TFLite model; a Transpose turns it
into NCHW for Conv, and fc1's rows are permuted from Keras' (h, w, c) flatten order
to ONNX's (c, h, w), so both formats compute the same function with the same weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tiergate.demo.data import IMAGE_SHAPE, INPUT_NAME, N_CLASSES, OUTPUT_NAME
from tiergate.demo.train import CnnWeights

OPSET = 17
IR_VERSION = 8          # readable by every onnxruntime the device images may carry
BATCH_DIM = "batch"


def _initializers(w: CnnWeights) -> list[onnx.TensorProto]:
    pooled_hw = IMAGE_SHAPE[0] // 2
    channels = w.conv_kernel.shape[-1]
    fc1_chw = (w.fc1_kernel.reshape(pooled_hw, pooled_hw, channels, -1)
               .transpose(2, 0, 1, 3).reshape(pooled_hw * pooled_hw * channels, -1))
    arrays = {
        "conv.weight": w.conv_kernel.transpose(3, 2, 0, 1),   # HWIO -> OIHW
        "conv.bias": w.conv_bias,
        "fc1.weight": fc1_chw,
        "fc1.bias": w.fc1_bias,
        "fc2.weight": w.fc2_kernel,
        "fc2.bias": w.fc2_bias,
    }
    return [numpy_helper.from_array(np.ascontiguousarray(a, dtype=np.float32), name)
            for name, a in arrays.items()]


def _nodes() -> list[onnx.NodeProto]:
    node = helper.make_node
    return [
        node("Transpose", [INPUT_NAME], ["image_nchw"], name="to_nchw", perm=[0, 3, 1, 2]),
        node("Conv", ["image_nchw", "conv.weight", "conv.bias"], ["conv"], name="conv",
             kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        node("Relu", ["conv"], ["conv_relu"], name="conv_relu"),
        node("MaxPool", ["conv_relu"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        node("Flatten", ["pool"], ["flat"], name="flatten", axis=1),
        node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1"),
        node("Relu", ["fc1"], ["fc1_relu"], name="fc1_relu"),
        node("Gemm", ["fc1_relu", "fc2.weight", "fc2.bias"], ["logits"], name="fc2"),
        node("Softmax", ["logits"], [OUTPUT_NAME], name="softmax", axis=-1),
    ]


def fp32_model(weights: CnnWeights, *, seed: int) -> onnx.ModelProto:
    """The FP32 reference graph, checked by onnx.checker."""
    graph = helper.make_graph(
        _nodes(), "digits_cnn",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [BATCH_DIM, *IMAGE_SHAPE])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [BATCH_DIM, N_CLASSES])],
        _initializers(weights))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tiergate-demo", doc_string="digits CNN, FP32 reference")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {"tiergate.demo.seed": str(seed), "tiergate.demo.precision": "fp32"})
    onnx.checker.check_model(model, full_check=True)
    return model


def write_fp32(weights: CnnWeights, path: Path, *, seed: int) -> Path:
    onnx.save(fp32_model(weights, seed=seed), str(path))
    return path


class _BatchReader:
    """A CalibrationDataReader over an array of images, in batches."""

    def __init__(self, images: np.ndarray, batch: int = 32):
        self._batches = [images[i:i + batch] for i in range(0, len(images), batch)]

    def get_next(self) -> dict[str, np.ndarray] | None:
        return {INPUT_NAME: self._batches.pop(0)} if self._batches else None

    def rewind(self) -> None:  # the quantizer may ask; one pass is all we give
        pass


def quantize_int8(fp32_path: Path, out_path: Path, calibration: np.ndarray, method: str) -> Path:
    """INT8 QDQ (per-channel weights, reduce_range) calibrated with `method` on `calibration`.

    reduce_range (7-bit weights) avoids the int16 saturation of onnxruntime's u8s8
    kernels on x86 CPUs without VNNI (AVX2): without it this model loses ~20 dB SQNR
    on such hosts but not on ARM, a device-tier difference the demo does not want to
    hide inside its "good" candidate.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    quantize_static(
        str(fp32_path), str(out_path), _BatchReader(calibration),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
        per_channel=True, reduce_range=True, calibrate_method=getattr(CalibrationMethod, method))
    return out_path
