"""Inputs whose truth is known for the task models (issue 41), and their candidates, shared by tests and bench/:

- `rec_lines(n, seed)`: text lines rendered with matplotlib's DejaVu fonts as PP-OCRv4's recogniser takes them
  ([n, 3, 48, 320] in [-1, 1], left-aligned, right-padded) and the texts (its FP32 reads 141 of 160 exactly).
- `det_pages(n, seed, blank=False)`: white 320 x 320 pages with rows of words, as PP-OCRv4's detector takes them
  ([n, 3, 320, 320] in [-1, 1]), and each page's word boxes (x, y, w, h): `coco(boxes)` is their side file.
- `photos(n, size, seed)`: crops of the photographs that ship with matplotlib and scikit-learn, [n, size, size, 3]
  in [0, 1] (NHWC, as MediaPipe's models take them).
- `rec_int8_per_tensor` / `rec_int8_dynamic` / `det_int8`: onnxruntime's own quantizers (static QDQ with per-tensor
  weights; dynamic on the MatMuls; static calibrated on the pages it is given: blank pages make the bad one).
- `tflite_snapped(data, bits)`: a float16-weight TFLite model (weights behind DEQUANTIZE) with every such weight
  snapped to a symmetric per-tensor grid of 2**bits levels, still stored as float16: a coarser model in float.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .kit import WORDS, fonts, line_pixels, rendered_line


def rec_lines(n: int, seed: int) -> tuple[np.ndarray, list[str]]:
    faces, rng = fonts(), np.random.default_rng(seed)
    x, texts = np.zeros((n, 3, 48, 320), np.float32), []
    for i in range(n):
        image, text = rendered_line(rng, faces)
        pixels, width = line_pixels(image, 320)
        x[i, :, :, :width] = pixels
        texts.append(text)
    return x, texts


def det_pages(n: int, seed: int, size: int = 320, blank: bool = False) -> tuple[np.ndarray, list[list[list[int]]]]:
    from PIL import Image, ImageDraw, ImageFont

    faces, rng = fonts(), np.random.default_rng(seed)
    x, boxes = np.zeros((n, 3, size, size), np.float32), []
    for i in range(n):
        image = Image.new("RGB", (size, size), (255, 255, 255))
        draw, page = ImageDraw.Draw(image), []
        y = int(rng.integers(4, 30))
        while not blank:
            text = " ".join(rng.choice(WORDS, rng.integers(1, 3)))
            font = ImageFont.truetype(str(faces[rng.integers(len(faces))]), int(rng.integers(14, 26)))
            left, top, right, bottom = font.getbbox(text)
            x0 = int(rng.integers(4, 120))
            if y + (bottom - top) > size - 4:
                break
            x0 = min(x0, max(4, size - 4 - (right - left)))
            draw.text((x0 - left, y - top), text, font=font, fill=(0, 0, 0))
            page.append([x0, y, right - left, bottom - top])
            y += (bottom - top) + int(rng.integers(8, 30))
        x[i] = ((np.asarray(image, np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
        boxes.append(page)
    return x, boxes


TEXT_IOU = '''
import json
from pathlib import Path

import numpy as np

BOXES = json.loads((Path(__file__).parent / "boxes.json").read_text())


def _parts(outputs, labels):
    """Each page's text pixels (the map above 0.3) against its word boxes: intersection and union per page."""
    maps = next(iter(outputs.values()))[:, 0] > 0.3
    inter, union = np.zeros(len(labels)), np.zeros(len(labels))
    for i, page in enumerate(np.asarray(labels, dtype=np.int64)):
        truth = np.zeros(maps.shape[1:], dtype=bool)
        for x, y, w, h in BOXES[page]:
            truth[y:y + h, x:x + w] = True
        inter[i], union[i] = (maps[i] & truth).sum(), (maps[i] | truth).sum()
    return inter, union


def text_iou(outputs, labels):
    """Per page (the fast form): its intersection and union."""
    inter, union = _parts(outputs, labels)
    return {"numerator": inter, "denominator": union}


def text_iou_whole(outputs, labels):
    """The same IoU as one number for the whole set (called again per bootstrap resample)."""
    inter, union = _parts(outputs, labels)
    return float(inter.sum() / union.sum())
'''


def text_iou_metric(folder: Path, boxes: list[list[list[int]]]) -> Path:
    """The issue's user metric (issue 46): `metrics.py` with `text_iou` (per page) and `text_iou_whole`, reading
    each page's word boxes from `boxes.json` beside it by the page index its label holds."""
    folder = Path(folder)
    (folder / "boxes.json").write_text(json.dumps(boxes))
    (folder / "metrics.py").write_text(TEXT_IOU)
    return folder / "metrics.py"


def coco(boxes: list[list[list[int]]]) -> str:
    """The boxes as a COCO-style side file (images in sample order; tiergate.labels)."""
    return json.dumps({"images": [{"id": i} for i in range(len(boxes))],
                       "annotations": [{"image_id": i, "bbox": b, "category_id": 0}
                                       for i, page in enumerate(boxes) for b in page],
                       "categories": [{"id": 0, "name": "text"}]})


def photos(n: int, size: int, seed: int) -> np.ndarray:
    import os

    import matplotlib
    import sklearn.datasets
    from PIL import Image

    sources = [Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"]
    sources += [Path(os.path.dirname(sklearn.datasets.__file__)) / "images" / name for name in ("china.jpg", "flower.jpg")]
    rng, out = np.random.default_rng(seed), []
    for i in range(n):
        image = Image.open(sources[i % len(sources)]).convert("RGB")
        w, h = image.size
        side = int(min(w, h) * rng.uniform(0.4, 1.0))
        x0, y0 = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
        crop = image.crop((x0, y0, x0 + side, y0 + side)).resize((size, size), Image.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        out.append(np.asarray(crop, np.float32) / 255.0)
    return np.stack(out)


def _prepared(source, folder: Path, name: str) -> Path:
    """The model at opset 13 (per-channel DequantizeLinear needs it), pre-processed as onnxruntime asks."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    opset13, prepared = folder / f"{name}_opset13.onnx", folder / f"{name}_prep.onnx"
    if not prepared.is_file():
        onnx.save(version_converter.convert_version(onnx.load(str(source)), 13), str(opset13))
        quant_pre_process(str(opset13), str(prepared), skip_symbolic_shape=True)
    return prepared


def _static(model: Path, out: Path, calibration: np.ndarray, batch: int, **options) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.items = iter({"x": calibration[i:i + batch]} for i in range(0, len(calibration), batch))

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(model), str(out), Batches(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, **options)
    return out


def rec_int8_per_tensor(source, folder, calibration: np.ndarray) -> Path:
    """PP-OCRv4 rec quantized static (QDQ) with per-tensor weights: its sequences fall apart (0 of 160 exact)."""
    folder = Path(folder)
    return _static(_prepared(source, folder, "rec"), folder / "rec_int8_per_tensor.onnx", calibration, 8,
                   per_channel=False)


def rec_int8_dynamic(source, folder) -> Path:
    """PP-OCRv4 rec with its MatMuls quantized dynamically (onnxruntime's quantize_dynamic)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = Path(folder)
    out = folder / "rec_int8_dynamic.onnx"
    quantize_dynamic(str(_prepared(source, folder, "rec")), str(out), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul"])
    return out


def det_int8(source, folder, calibration: np.ndarray, name: str) -> Path:
    """PP-OCRv4 det quantized static (QDQ, per-channel weights), calibrated on `calibration` (blank pages: every
    activation range collapses, the probability map is all zero)."""
    folder = Path(folder)
    return _static(_prepared(source, folder, "det"), folder / f"det_int8_{name}.onnx", calibration, 4,
                   per_channel=True)


def tflite_snapped(data: bytes, bits: int) -> bytes:
    import ai_edge_litert.schema_py_generated as schema
    import flatbuffers

    model = schema.ModelT.InitFromPackedBuf(data, 0)
    graph = model.subgraphs[0]
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        source = graph.tensors[op.inputs[0]] if op.inputs is not None and len(op.inputs) else None
        if (max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.DEQUANTIZE
                and source is not None and source.type == schema.TensorType.FLOAT16
                and model.buffers[source.buffer].data is not None):
            values = np.frombuffer(bytes(model.buffers[source.buffer].data), np.float16).astype(np.float32)
            top = float(np.abs(values).max())
            step = top / (2 ** (bits - 1) - 1) if top > 0 else 1.0
            snapped = (np.round(values / step) * step).astype(np.float16)
            model.buffers[source.buffer].data = np.frombuffer(snapped.tobytes(), np.uint8)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
