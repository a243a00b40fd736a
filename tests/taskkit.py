"""Small models of the tasks edge teams ship, and their inputs, made by the tests (no download): a YOLO-style
detector whose head concatenates boxes and class scores in one output, the images it sees, and its INT8 made by
onnxruntime's own quantizer. Real models (PP-OCR's detector and recogniser, MediaPipe's) live in
tests/realmodels/kit.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CLASSES = ("red", "green", "blue")
STRIDE = 8          # one anchor per 8 x 8 pixels of the input
SCALE = 4           # boxes in the pixels of a 4x larger original (a 640-pixel letterbox for a 160-pixel input)


def yolo_like(size: int = 160, seed: int = 0) -> onnx.ModelProto:
    """images (N, 3, size, size) in [0, 1] -> output0 (N, 4 + 3, A): per anchor (one per 8 x 8 cell) a box
    (cx, cy, w, h in the original's pixels, 0..4 x size) and a sigmoid score per class (the cell's mean colour),
    concatenated as ultralytics' YOLOv8 export does; its metadata names the classes."""
    grid = size // STRIDE
    anchors = grid * grid
    rng = np.random.default_rng(seed)
    gy, gx = np.mgrid[0:grid, 0:grid].astype(np.float32)
    base = np.stack([gx + 0.5, gy + 0.5, np.ones_like(gx), np.ones_like(gx)])[None]        # (1, 4, G, G)
    inits = [
        numpy_helper.from_array((np.eye(3, dtype=np.float32) * 24.0)[:, :, None, None], "cls_w"),
        numpy_helper.from_array(np.full(3, -14.0, np.float32), "cls_b"),
        numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 1, 1)).astype(np.float32), "box_w"),
        numpy_helper.from_array(np.zeros(4, np.float32), "box_b"),
        numpy_helper.from_array(base, "grid"),
        numpy_helper.from_array(np.array(STRIDE * SCALE, np.float32), "stride"),
        numpy_helper.from_array(np.array([0, 4, anchors], np.int64), "box_shape"),
        numpy_helper.from_array(np.array([0, 3, anchors], np.int64), "cls_shape"),
    ]
    nodes = [
        helper.make_node("AveragePool", ["images"], ["cells"], kernel_shape=[STRIDE, STRIDE], strides=[STRIDE, STRIDE]),
        helper.make_node("Conv", ["cells", "cls_w", "cls_b"], ["cls_logits"]),
        helper.make_node("Sigmoid", ["cls_logits"], ["cls"]),
        helper.make_node("Conv", ["cells", "box_w", "box_b"], ["offsets"]),
        helper.make_node("Add", ["offsets", "grid"], ["cell_boxes"]),
        helper.make_node("Mul", ["cell_boxes", "stride"], ["boxes"]),
        helper.make_node("Reshape", ["boxes", "box_shape"], ["boxes_flat"]),
        helper.make_node("Reshape", ["cls", "cls_shape"], ["cls_flat"]),
        helper.make_node("Concat", ["boxes_flat", "cls_flat"], ["output0"], axis=1),
    ]
    graph = helper.make_graph(nodes, "yolo_like",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, size, size])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", 4 + 3, anchors])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8,
                              producer_name="tiergate-tests")
    helper.set_model_props(model, {"names": str(dict(enumerate(CLASSES))), "stride": str(STRIDE),
                                   "imgsz": f"[{size}, {size}]", "task": "detect"})
    onnx.checker.check_model(model)
    return model


def scenes(n: int, seed: int, size: int = 160) -> np.ndarray:
    """(n, 3, size, size) float32 images in [0, 1]: a dark noisy background with 3 to 8 squares of pure red,
    green or blue (16 to 48 pixels a side)."""
    rng = np.random.default_rng(seed)
    images = rng.uniform(0.0, 0.15, (n, 3, size, size)).astype(np.float32)
    for image in images:
        for _ in range(rng.integers(3, 9)):
            side = int(rng.integers(16, 49))
            x, y = (int(v) for v in rng.integers(0, size - side, 2))
            image[:, y:y + side, x:x + side] = 0.05
            image[int(rng.integers(3)), y:y + side, x:x + side] = rng.uniform(0.8, 1.0)
    return images


def yolo_int8(fp32: Path, out: Path, calibration: np.ndarray, *, keep_concat_float: bool = False) -> Path:
    """The detector quantized by onnxruntime's quantize_static (QDQ, per-channel int8 weights, uint8 activations),
    calibrated on `calibration`. As exported, the Concat's output is one tensor with one scale over box
    coordinates (0..640) and scores (0..1): the scores keep a level or two. keep_concat_float leaves the Concat
    and its inputs unquantized (the fix: each part on its own scale)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Images(CalibrationDataReader):
        def __init__(self):
            self.items = iter({"images": calibration[i:i + 1]} for i in range(len(calibration)))

        def get_next(self):
            return next(self.items, None)

    model = onnx.load(str(fp32))
    exclude = [n.name for n in model.graph.node if n.op_type in ("Concat", "Reshape", "Sigmoid")] \
        if keep_concat_float else []
    if keep_concat_float and not all(exclude):
        for i, node in enumerate(model.graph.node):
            node.name = node.name or f"{node.op_type}_{i}"
        onnx.save(model, str(fp32))
        exclude = [n.name for n in model.graph.node if n.op_type in ("Concat", "Reshape", "Sigmoid")]
    quantize_static(str(fp32), str(out), Images(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=exclude)
    return out


def resaved(source: Path, out: Path) -> Path:
    """The same network in a byte-different file (another producer name): a float candidate equal to FP32."""
    model = onnx.load(str(source))
    model.producer_name = "tiergate-tests-resaved"
    onnx.save(model, str(out))
    return out
