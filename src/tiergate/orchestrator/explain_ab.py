"""explain's fixes, gated through the one gate path: the reference re-quantized with the worst layers kept in
float (mixed precision), gated A/B against the INT8 candidate on the same tiers.

The tensor dumps themselves run in tiergate.execution.explain (the runner seam); what is made and gated of
them lives here, beside the orchestrator whose `gate` it calls.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np

from tiergate import explain as core
from tiergate.errors import InputError
from tiergate.execution.explain import DEFAULT_SAMPLES, DockerRunner, eval_data
from tiergate.orchestrator.seams import DockerBuilder, Seams
from tiergate.orchestrator.sequence import gate
from tiergate.orchestrator.types import say
from tiergate.request import BuildSettings, GateRequest, RunOptions, source_file
from tiergate.targets import DeviceClass


def docker_runner(settings: BuildSettings | None = None) -> DockerRunner:
    """The real tensor-dump runner: each class's runtime image, built by the builder seam with `settings`."""
    return DockerRunner(DockerBuilder(settings or BuildSettings()).runtime_image)


def check_mixed_precision(candidate: Path, reference: Path, out: Path,
                          inputs: list[tuple[str, Path | None]] = (), *, outside_home: bool = True) -> None:
    """What --mixed-precision needs, checked before any work starts: ONNX artifacts (the mixed candidate is made by
    onnxruntime's quantizer from the ONNX FP32 reference), and an output path that is no input and not inside the
    home (paths.check_outputs; `inputs`: the other files the command reads)."""
    from tiergate.artifact.detect import detect_format, read_model_file
    from tiergate.artifact.files import artifact_parts
    from tiergate.paths import check_outputs

    for role, path in (("candidate", candidate), ("reference", reference)):
        fmt = detect_format(Path(path), read_model_file(Path(path)))
        if fmt != "onnx":
            raise InputError(f"--mixed-precision: the {role} {path} is {fmt}; a mixed-precision candidate is made "
                             "by onnxruntime's quantizer from an ONNX FP32 reference, so it needs ONNX artifacts")
    check_outputs([("--mixed-precision", Path(out))], list(inputs),
                  artifacts=[("candidate", candidate), ("reference", reference)], parts=artifact_parts,
                  outside_home=outside_home)


def artifact_size(path: Path) -> int:
    """The bytes an artifact is made of: the model file and its ONNX external data files."""
    from tiergate.artifact.files import artifact_parts

    return Path(path).stat().st_size + sum(part.stat().st_size for part in artifact_parts(Path(path)))


def quant_settings(path: Path) -> dict:
    """The quantization settings a QDQ or QOperator ONNX candidate shows: format, per-channel,
    activation and weight types, reduce_range (weights within 7 bits)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    ops = {n.op_type for n in model.graph.node}
    qlinear = any(op.startswith("QLinear") or op in ("QGemm", "QAttention") for op in ops)
    if not (ops & {"QuantizeLinear", "DequantizeLinear"}) and not qlinear:
        raise InputError(f"{path}: the candidate is not quantized (no QuantizeLinear, DequantizeLinear or QLinear "
                         "op): there are no settings to re-quantize with")
    act, weight, per_channel, reduce_range = "uint8", "int8", False, False
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in inits and len(node.input) > 2 \
                and node.input[2] in inits:
            act = numpy_helper.to_array(inits[node.input[2]]).dtype.name
            break
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            w = numpy_helper.to_array(inits[node.input[0]])
            if w.dtype.name not in ("int8", "uint8") or w.ndim < 2:
                continue                                    # biases are int32
            weight = w.dtype.name
            per_channel = per_channel or numpy_helper.to_array(inits[node.input[1]]).size > 1
            reduce_range = bool(w.dtype.name == "int8" and w.min() >= -64 and w.max() <= 63)
    return {"format": "QOperator" if qlinear and "QuantizeLinear" not in ops else "QDQ",
            "activation_type": act, "weight_type": weight, "per_channel": per_channel,
            "reduce_range": reduce_range}


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


def requantize(reference: Path, out: Path, calibration: Path, settings: dict, exclude: list[str]) -> Path:
    """The reference quantized by onnxruntime with `settings`, `exclude` kept in float, calibrated on `calibration`."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from tiergate.artifact import load_artifact

    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    names = [i.name for i in load_artifact(reference).inputs]
    quantize_static(str(reference), str(out), _NpzReader(calibration, names),
                    quant_format=QuantFormat.QDQ if settings["format"] == "QDQ" else QuantFormat.QOperator,
                    activation_type=types[settings["activation_type"]], weight_type=types[settings["weight_type"]],
                    per_channel=settings["per_channel"], reduce_range=settings["reduce_range"],
                    nodes_to_exclude=list(exclude))
    return out


def host_sqnr(model: Path, reference: Path, data_path: Path, samples: int = DEFAULT_SAMPLES) -> float:
    """End-to-end SQNR (worst output) of `model` against `reference` with this machine's onnxruntime."""
    import onnxruntime as ort

    from tiergate.evaldata import load_eval_data

    data = load_eval_data(data_path)
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (model, reference)]
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


def choose_exclusions(result: core.Explanation, reference: Path, data_path: Path, calibration: Path,
                      settings: dict, work: Path, *, steps: int = 4) -> tuple[list[str], list]:
    """Greedy: the worst layers' nodes (across tiers) kept in float, one layer more at a time, until the
    re-quantized model's end-to-end SQNR (on this host) clears the strictest tier's threshold. Returns (nodes,
    trail)."""
    threshold_db = min((t.threshold_db for t in result.targets.values()), default=core.DEFAULT_THRESHOLD_DB)
    layers: list[core.Layer] = []
    for item in result.targets.values():
        outputs = {layer.tensor for layer in item.layers[-1:]}
        for layer in core.worst_layers(item.layers, item.threshold_db, outputs):
            if layer.tensor not in {x.tensor for x in layers}:
                layers.append(layer)
    exclude: list[str] = result.keep_float()      # the suggestions first, then one worst layer more a step
    trail = []
    for step in range(steps + 1):
        trial = requantize(reference, work / f"mixed-{step}.onnx", calibration, settings, exclude)
        sqnr = host_sqnr(trial, reference, data_path)
        trail.append({"excluded": list(exclude), "end_to_end_sqnr_db": round(sqnr, 2)})
        if sqnr >= threshold_db or step >= len(layers):
            break
        exclude += [n for layer in layers[step:step + 1] for n in layer.nodes if n not in exclude]
    return exclude, trail


def mixed_precision_ab(result: core.Explanation, request: GateRequest, calibration: Path, out: Path,
                       seams: Seams | None = None, options: RunOptions | None = None) -> dict:
    """Write the mixed-precision candidate to `out` and gate it and the INT8 candidate (request.candidate) on the
    same tiers (the mixed one with the INT8 candidate as its incumbent: the A/B): verdicts, whether each passes
    against the FP32 reference alone, the A/B checks, sizes, latency on real tiers."""
    options = options or RunOptions()
    candidate, reference = Path(request.candidate), Path(request.reference)
    check_mixed_precision(candidate, reference, Path(out),
                          [("evaluation data", source_file(request.data)), ("calibration data", Path(calibration)),
                           ("incumbent", request.incumbent)], outside_home=False)   # the CLI checked the home
    from tiergate.artifact import load_artifact

    data = eval_data(request.data, load_artifact(reference).inputs).path
    if Path(calibration).resolve() == data.resolve():
        say(options.progress, "calibrating on the evaluation data, as asked (its accuracy figures are then "
                              "optimistic)")
    settings = quant_settings(candidate)
    with tempfile.TemporaryDirectory(prefix="tiergate-mixed-") as tmp:
        say(options.progress, "re-quantizing the reference with the worst layers kept in float")
        exclude, trail = choose_exclusions(result, reference, data, calibration, settings, Path(tmp))
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(tmp) / f"mixed-{len(trail) - 1}.onnx", out)
    say(options.progress, "gating the INT8 candidate")
    int8 = gate(request, seams, options)
    say(options.progress, "gating the mixed-precision candidate against the INT8 one (A/B)")
    mixed = gate(dataclasses.replace(request, candidate=Path(out), incumbent=candidate), seams, options)
    classes = list(request.device_classes)
    return {"settings": settings, "trail": trail,
            "int8": _side(int8, candidate, "candidate", classes, []),
            "mixed": _side(mixed, Path(out), "candidate", classes, exclude)}


def _side(run, path: Path, role: str, device_classes: list[DeviceClass], excluded: list[str]) -> dict:
    latency = {}
    for dc in device_classes:
        outcome = run.outcomes.get(role, {}).get(dc.name)
        if dc.emulated or outcome is None or not outcome.result.latencies_ns:
            continue
        latency[dc.name] = float(np.mean(outcome.result.latencies_ns)) / 1e6
    own = [c for c in run.decision.checks if not c.name.startswith("noninferior")]
    ab = [c for c in run.decision.checks if c.name.startswith("noninferior")]
    return {"path": str(path), "verdict": run.decision.verdict, "reasons": list(run.decision.reasons),
            "passes_against_reference": bool(own) and all(c.passed for c in own),
            "ab": {f"{c.device_class}/{c.name}": {"value": c.value, "threshold": c.threshold, "passed": c.passed}
                   for c in ab},
            "size_bytes": artifact_size(path), "latency_ms": latency, "excluded": excluded}
