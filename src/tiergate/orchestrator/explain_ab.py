"""explain's candidates, made by onnxruntime's quantizer from the FP32 reference: the quantization settings a
candidate shows (`quant_settings`: its recipe, tiergate.explain.recipe) and its own activation ranges
(`candidate_ranges`), the reference (prepared as the candidate's was) re-quantized with them (`requantize`: a calibration method, ranges to keep, nodes kept in float), the checks `--fix` and
`--mixed-precision` need before any work, and an end-to-end SQNR on this host (`host_sqnr`).

What is made here is searched and gated through the one gate path in tiergate.orchestrator.explain_fix; the
tensor dumps themselves run in tiergate.execution.explain (the runner seam).
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np

from tiergate import explain as core
from tiergate.errors import InputError
from tiergate.execution.explain import DEFAULT_SAMPLES, DockerRunner
from tiergate.orchestrator.seams import DockerBuilder
from tiergate.request import BuildSettings


def docker_runner(settings: BuildSettings | None = None) -> DockerRunner:
    """The real tensor-dump runner: each class's runtime image, built by the builder seam with `settings`."""
    return DockerRunner(DockerBuilder(settings or BuildSettings()).runtime_image)


def require_onnx(option: str, candidate: Path, reference: Path) -> None:
    """`option`'s candidates are made by onnxruntime's quantizer from the ONNX FP32 reference: refuse other
    formats (exit 2) before any work."""
    from tiergate.artifact.detect import detect_format, read_model_file

    for role, path in (("candidate", candidate), ("reference", reference)):
        fmt = detect_format(Path(path), read_model_file(Path(path)))
        if fmt != "onnx":
            raise InputError(f"{option}: the {role} {path} is {fmt}; {option} needs ONNX artifacts (its candidates "
                             "are made by onnxruntime's quantizer from an ONNX FP32 reference)")


def check_mixed_precision(candidate: Path, reference: Path, out: Path,
                          inputs: list[tuple[str, Path | None]] = (), *, outside_home: bool = True) -> None:
    """What --mixed-precision needs, checked before any work starts: ONNX artifacts, and an output path that is
    no input and not inside the home (paths.check_outputs; `inputs`: the other files the command reads)."""
    from tiergate.artifact.files import artifact_parts
    from tiergate.paths import check_outputs

    require_onnx("--mixed-precision", candidate, reference)
    check_outputs([("--mixed-precision", Path(out))], list(inputs),
                  artifacts=[("candidate", candidate), ("reference", reference)], parts=artifact_parts,
                  outside_home=outside_home)


def artifact_size(path: Path) -> int:
    """The bytes an artifact is made of: the model file and its ONNX external data files."""
    from tiergate.artifact.files import artifact_parts

    return Path(path).stat().st_size + sum(part.stat().st_size for part in artifact_parts(Path(path)))


def quant_settings(path: Path, reference: Path | None = None) -> dict:
    """The candidate's own recipe (tiergate.explain.recipe.settings)."""
    from tiergate.explain.recipe import settings

    return settings(path, reference)


# the output scale and zero point of onnxruntime's QOperator ops (input positions)
_QLINEAR_OUTPUT = {"QLinearConv": (6, 7), "QLinearMatMul": (6, 7), "QLinearAdd": (6, 7), "QLinearMul": (6, 7),
                   "QGemm": (7, 8), "QLinearSigmoid": (3, 4), "QLinearLeakyRelu": (3, 4),
                   "QLinearGlobalAveragePool": (3, 4), "QLinearAveragePool": (3, 4), "QLinearConcat": (0, 1)}


def candidate_ranges(candidate: Path, reference: Path) -> tuple[dict, list[str]]:
    """The candidate's own activation quantization, by the reference's tensor names, as onnxruntime's
    TensorQuantOverrides ({tensor: [{"scale", "zero_point"}]}): a QuantizeLinear's input named like a reference
    tensor (or, when the quantizer renamed it, the name of its DequantizeLinear's output), and a QOperator op's
    output (`NAME_quantized` -> NAME). Per-tensor scales only. Returns (overrides, candidate tensors whose range
    has no reference tensor to go to)."""
    import onnx
    from onnx import numpy_helper

    cand, ref = onnx.load(str(candidate)).graph, onnx.load(str(reference)).graph
    known = {t for n in ref.node for t in n.output} | {i.name for i in ref.input}
    inits = {t.name: t for t in cand.initializer}
    dequantized = {n.input[0]: n.output[0] for n in cand.node if n.op_type == "DequantizeLinear"}

    def const(name):
        return numpy_helper.to_array(inits[name]) if name in inits else None

    overrides, missed = {}, []
    for node in cand.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in inits and len(node.input) > 2:
            names, (scale, zero_point) = [node.input[0], dequantized.get(node.output[0], "")], node.input[1:3]
        elif node.op_type in _QLINEAR_OUTPUT:
            s, z = _QLINEAR_OUTPUT[node.op_type]
            if len(node.input) <= z:
                continue
            names, scale, zero_point = [node.output[0].removesuffix("_quantized"), node.output[0]], \
                node.input[s], node.input[z]
        else:
            continue
        scale, zero_point = const(scale), const(zero_point)
        if scale is None or zero_point is None or scale.size != 1:
            missed.append(names[0])
            continue
        target = next((name for name in names if name in known), None)
        if target is None:
            missed.append(names[0])
            continue
        overrides.setdefault(target, [{"scale": np.array(scale.reshape(()), np.float32),
                                       "zero_point": zero_point.reshape(())}])
    return overrides, missed


class _NpzReader:
    """A CalibrationDataReader over an .npz of model inputs, one sample at a time."""

    def __init__(self, path: Path, names: list[str]):
        from tiergate.evaldata import load_eval_data

        data = load_eval_data(path)
        missing = [n for n in names if n not in data.info]
        if missing:
            raise InputError(f"calibration data {path}: model input '{missing[0]}' is missing "
                             f"(arrays: {', '.join(data.info)})")
        self._batches = iter(list(data.iter_batches(1)))

    def get_next(self):
        return next(self._batches, None)


CALIBRATIONS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}


def requantize(reference: Path, out: Path, calibration: Path, settings: dict, exclude: list[str], *,
               method: str = "minmax", percentile: float | None = None, overrides: dict | None = None) -> Path:
    """The reference (prepared as the candidate's was: tiergate.explain.recipe.prepared) quantized by onnxruntime's
    quantize_static with the candidate's `settings` (its recipe: format, types, per-channel, reduce_range, symmetry,
    the op types it quantized and the nodes it kept in float), `exclude` (node names) kept in float too, calibrated
    on `calibration` by `method` (CALIBRATIONS; `percentile` for "percentile"), `overrides` (TensorQuantOverrides:
    ranges kept as given instead of calibrated)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from tiergate.artifact import load_artifact

    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    names = [i.name for i in load_artifact(reference).inputs]
    extra = {}
    if percentile is not None:
        extra["CalibPercentile"] = float(percentile)
    if overrides:
        extra["TensorQuantOverrides"] = overrides
    for key, option in (("activation_symmetric", "ActivationSymmetric"), ("weight_symmetric", "WeightSymmetric")):
        if settings.get(key) is not None:
            extra[option] = bool(settings[key])
    present = {n.name for n in onnx.load(str(reference)).graph.node}
    kept = [n for n in settings.get("float_nodes", []) if n in present]
    # the op types only when the candidate left some in float: naming every type is not onnxruntime's default (it
    # then also quantizes a Div's constant divisor, 24 more DequantizeLinear in PP-OCRv4 det's optimized graph)
    op_types = list(settings.get("op_types") or []) if settings.get("float_op_types") else None
    with _quiet():
        quantize_static(str(reference), str(out), _NpzReader(calibration, names),
                        quant_format=QuantFormat.QDQ if settings["format"] == "QDQ" else QuantFormat.QOperator,
                        activation_type=types[settings["activation_type"]],
                        weight_type=types[settings["weight_type"]], per_channel=settings["per_channel"],
                        reduce_range=settings["reduce_range"], nodes_to_exclude=list(dict.fromkeys([*exclude, *kept])),
                        op_types_to_quantize=op_types,
                        calibrate_method=getattr(CalibrationMethod, CALIBRATIONS[method]), extra_options=extra)
    return out


@contextlib.contextmanager
def _quiet():
    """onnxruntime's quantizer logs on the root logger at every call ("please consider pre-processing": the settings
    are the candidate's own, pre-processing included when it was; "Axis 1 is out-of-range for weight ..." of a
    BatchNormalization's per-channel weights), and its histogram calibrators print their progress on stdout (which
    --json owns): a third party's advice and chatter, held back (its errors pass)."""
    class Advice(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return record.levelno >= logging.ERROR

    advice, root = Advice(), logging.getLogger()       # the quantizer logs through the root logger itself
    root.addFilter(advice)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.removeFilter(advice)


def host_sqnr(model: Path, reference: Path, data_path: Path, samples: int = DEFAULT_SAMPLES) -> float:
    """End-to-end SQNR (worst output) of `model` against `reference` with this machine's onnxruntime."""
    from tiergate.evaldata import load_eval_data
    from tiergate.ort_session import session as make_session

    data = load_eval_data(data_path)
    sessions = [make_session(str(p)) for p in (model, reference)]
    outs = [[], []]
    for i, batch in enumerate(data.iter_batches(1)):
        if i >= samples:
            break
        for store, session in zip(outs, sessions):
            store.append(session.run(None, {k: batch[k] for k in (x.name for x in session.get_inputs())}))
    worst = core.SQNR_CAP_DB
    for k in range(len(outs[0][0])):
        got = np.stack([o[k] for o in outs[0]])
        want = np.stack([o[k] for o in outs[1]])
        worst = min(worst, core.sqnr_db(want, got))
    return worst
