"""`tiergate explain`'s runs: each tier's runtime dumps the candidate's and the reference's tensors.

`explain(candidate, reference, data, device_classes, policy)` prepares the models
(tiergate.explain.plan), runs containers/harness/tiergate_explain.py once per device class in
the class's runtime image (the harness run's confinement: no network, read-only root,
non-root, the class's limits and timeout; the models, the script and the data travel in the
job's input volume, like the runtime describer), and pairs what each tier saw
(tiergate.explain.analyse). The dumps are cached under TIERGATE_HOME/explain/ by (candidate,
reference, data, image id, script, samples): a folder appears there only complete.

The runner is a seam: `DockerRunner` is the real one; `HostRunner` runs the same script with
this Python (tests, and a quick look without Docker).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from tiergate import explain as core
from tiergate.errors import InfrastructureFault, InputError, TiergateError
from tiergate.hashing import file_sha256
from tiergate.paths import containers_dir, home
from tiergate.targets import DeviceClass

SCRIPT = "harness/tiergate_explain.py"
INPUT_DIR = "/data"
CACHE_DIR = "explain"
DEFAULT_SAMPLES = 32
Progress = Callable[[str], None]


def script_path() -> Path:
    return containers_dir() / SCRIPT


class Runner(Protocol):
    """Runs the dump script for one device class; fills `out` with explain.json and NAME.npz files.
    `identity(dc)` names what runs (an image id), for the cache key."""

    def identity(self, dc: DeviceClass) -> str: ...

    def run(self, dc: DeviceClass, models: dict[str, Path], data: Path, samples: int, out: Path) -> None: ...


class HostRunner:
    """The dump script with this machine's Python and runtime (no container, no tier: tests, quick looks)."""

    def identity(self, dc: DeviceClass) -> str:
        return f"host-{sys.executable}"

    def run(self, dc, models, data, samples, out) -> None:
        cmd = [sys.executable, "-s", str(script_path()), "--runtime", dc.runtime, "--data", str(data),
               "--out", str(out), "--max-samples", str(samples), "--threads", str(dc.threads)]
        for name, path in models.items():
            cmd += ["--model", f"{name}={path}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=dc.limits.timeout_s)
        if not (out / "explain.json").is_file():
            raise InputError(f"{dc.name}: the tensor dump failed: {_last(done.stderr) or done.returncode}")


class DockerRunner:
    """The dump script inside the device class's runtime image (built once, like a harness run's)."""

    def __init__(self, base_image: str | None = None, ca_bundle: Path | None = None):
        self.base_image, self.ca_bundle = base_image, ca_bundle
        self._images: dict[str, str] = {}

    def _client(self, dc):
        from tiergate.execution.engine import connect, with_retries

        return with_retries(lambda: connect(dc.docker_host), what=f"connecting to {dc.docker_host}")

    def image(self, dc: DeviceClass, client) -> tuple[str, str]:
        from tiergate.build import ensure_runtime_image

        runtime = ensure_runtime_image(dc, client=client, base_image=self.base_image, ca_bundle=self.ca_bundle)
        return runtime.tag, runtime.image_id

    def identity(self, dc: DeviceClass) -> str:
        if dc.name not in self._images:
            client = self._client(dc)
            try:
                self._images[dc.name] = self.image(dc, client)[1]
            finally:
                client.close()
        return self._images[dc.name]

    def run(self, dc, models, data, samples, out) -> None:
        from tiergate.execution.engine import with_retries

        client = self._client(dc)
        try:
            tag, _ = self.image(dc, client)
            with_retries(lambda: self._attempt(client, dc, tag, models, data, samples, out),
                         what=f"explaining on {dc.name}")
        finally:
            client.close()

    def _attempt(self, client, dc, tag, models, data, samples, out) -> None:
        from tiergate.execution.base import Job, last_line
        from tiergate.execution.describe import _upload
        from tiergate.execution.docker_backend import DockerBackend, _job_volumes, _run
        from tiergate.images import LABEL, BuiltImage

        files = [(path, f"{name}{path.suffix}") for name, path in models.items()]
        files += [(Path(data), "data.npz"), (script_path(), "tiergate_explain.py")]
        job = Job(device_class=dc, data_npz=Path(os.devnull), out_dir=out,
                  image=BuiltImage(tag, "", {f"{LABEL}.model.path": "/data/none"}, True))
        with _job_volumes(client) as (data_volume, out_volume):
            _upload(client, tag, data_volume, files)
            spec = DockerBackend(dc.docker_host, gpu=dc.gpu).spec(job, data_volume, out_volume)
            command = ["--runtime", dc.runtime, "--data", f"{INPUT_DIR}/data.npz", "--out", "/out",
                       "--max-samples", str(samples), "--threads", str(dc.threads)]
            for name, path in models.items():
                command += ["--model", f"{name}={INPUT_DIR}/{name}{path.suffix}"]
            spec.update(entrypoint=["python3", "-s", f"{INPUT_DIR}/tiergate_explain.py"], command=command)
            container = client.containers.create(**spec)
            try:
                reason, log_tail, _oom = _run(container, job)
                _download(container, out)
            finally:
                container.remove(force=True)
        if (out / "explain.json").is_file():
            return
        raise_for = InputError if reason and "exited with code" in reason else InfrastructureFault
        raise raise_for(f"{dc.name}: the tensor dump failed in {tag}: {reason or 'no explain.json'} "
                        f"({last_line(log_tail) or 'no output'})")


def _download(container, out: Path) -> None:
    from tiergate.execution.docker_backend import download

    download(container, out, lambda name: name == "explain.json" or name.endswith(".npz"))


def _last(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- the whole explain ------------------------------------------------------------------


def explain(candidate: Path, reference: Path, data_path: Path, device_classes: list[DeviceClass], policy=None,
            *, runner: Runner | None = None, samples: int = DEFAULT_SAMPLES, threshold_db: float | None = None,
            progress: Progress | None = None) -> core.Explanation:
    """Every device class's explanation of the candidate against its FP32 reference."""
    from tiergate.artifact import load_artifact
    from tiergate.evaldata import load_eval_data, validate_against

    if samples < 1:
        raise InputError("--samples must be at least 1")
    cand_art, ref_art = load_artifact(candidate), load_artifact(reference)
    for dc in device_classes:
        for art in (cand_art, ref_art):
            if art.format != dc.artifact_format:
                raise InputError(f"{art.path}: is {art.format}, but device class {dc.name} runs {dc.runtime}")
    data = load_eval_data(data_path)
    validate_against(data, ref_art.inputs)
    validate_against(data, _float_fed(cand_art, ref_art))
    runner = runner or DockerRunner()
    n = min(samples, data.n_samples)
    inputs = {name: np.asarray(data.arrays[name][:n])[:, None] for name in data.info}
    out = core.Explanation(str(candidate), str(reference))
    with tempfile.TemporaryDirectory(prefix="tiergate-explain-") as tmp:
        plan = core.plan(Path(candidate), Path(reference), Path(tmp))
        models = {"candidate": plan.candidate, "reference": plan.reference}
        for dc in device_classes:
            limit = threshold_db if threshold_db is not None else _threshold(policy, dc)
            _say(progress, f"dumping tensors on {dc.name}")
            t0 = time.monotonic()
            try:
                folder = _dump(runner, dc, models, cand_art.sha256, ref_art.sha256, data.sha256, data.path, n)
            except InputError:
                raise
            except TiergateError as exc:
                out.targets[dc.name] = core.TierExplain(dc.name, limit, error=exc.one_line())
                continue
            dumps, meta = load_dumps(folder)
            meta["inputs"] = inputs
            meta.setdefault("seconds", time.monotonic() - t0)
            if meta.get("error"):
                out.targets[dc.name] = core.TierExplain(dc.name, limit, error=meta["error"],
                                                        machine=meta.get("machine", ""))
                continue
            out.targets[dc.name] = core.analyse(plan, dc.name, dumps, threshold_db=limit, meta=meta)
            out.targets[dc.name].seconds = time.monotonic() - t0
    return out


def _float_fed(cand_art, ref_art) -> list:
    """The candidate's inputs as the data must feed them. A fully integer TFLite candidate (int8/uint8
    inputs) reads the reference's float data: the dump script quantizes it with the input's own scale
    and zero point, as the converter's own debugger does."""
    if cand_art.format != "tflite":
        return list(cand_art.inputs)
    ref_dtypes = {spec.name: spec.dtype for spec in ref_art.inputs}
    return [dataclasses.replace(spec, dtype=ref_dtypes[spec.name])
            if spec.dtype in ("int8", "uint8") and ref_dtypes.get(spec.name, "").startswith("float") else spec
            for spec in cand_art.inputs]


def _threshold(policy, dc: DeviceClass) -> float:
    if policy is None:
        return core.DEFAULT_THRESHOLD_DB
    value = policy.for_target(dc).min_sqnr_db
    return core.DEFAULT_THRESHOLD_DB if value is None else float(value)


def _dump(runner: Runner, dc, models, cand_sha, ref_sha, data_sha, data_path, n) -> Path:
    key_text = "\0".join((cand_sha, ref_sha, data_sha, runner.identity(dc), dc.name,
                          file_sha256(script_path()), str(n)))
    key = hashlib.sha256(key_text.encode()).hexdigest()[:24]
    folder = home() / CACHE_DIR / key
    if (folder / "explain.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = folder.parent / f".{key}.{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    t0 = time.monotonic()
    try:
        runner.run(dc, models, Path(data_path), n, work)
        doc = json.loads((work / "explain.json").read_text())
        doc["host_seconds"] = round(time.monotonic() - t0, 3)
        (work / "explain.json").write_text(json.dumps(doc))
        if not doc.get("ok"):        # a refusal is not cached: the next explain asks again
            target = folder.parent / f".{key}.failed.{os.getpid()}"
            shutil.rmtree(target, ignore_errors=True)
            work.rename(target)
            return target
        try:
            os.rename(work, folder)
        except OSError:
            shutil.rmtree(work, ignore_errors=True)
        return folder
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def load_dumps(folder: Path) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    """({"candidate": {tensor: array}, "reference": {...}}, meta) from a dump folder."""
    doc = json.loads((folder / "explain.json").read_text())
    dumps, meta = {}, {"machine": doc.get("machine", ""), "seconds": doc.get("host_seconds", 0.0),
                       "error": doc.get("error", "")}
    for name, entry in doc.get("models", {}).items():
        path = folder / f"{name}.npz"
        if not path.is_file():
            continue
        with np.load(path, allow_pickle=False) as npz:
            dumps[name] = {_unsuffixed(entry["tensors"][key]): npz[key] for key in npz.files
                           if key in entry["tensors"]}
        meta[f"{name}_quant"] = entry.get("quant", {})
        meta[f"{name}_ops"] = entry.get("ops", {})
        meta[f"{name}_outputs"] = entry.get("outputs", [])
    return dumps, meta


# onnxruntime's modify_model_output_intermediate_tensors exposes tensor T flattened, as T + this
_SAVED_SUFFIX = "_ReshapedSavedOutput"


def _unsuffixed(name: str) -> str:
    return name[: -len(_SAVED_SUFFIX)] if name.endswith(_SAVED_SUFFIX) else name


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


# --- mixed precision: the reference re-quantized with the suggested nodes in float, gated A/B ---------


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
                      settings: dict, work: Path, threshold_db: float, *, steps: int = 4) -> tuple[list[str], list]:
    """Greedy: the worst layers' nodes (across tiers) kept in float, one layer more at a time, until the
    re-quantized model's end-to-end SQNR (on this host) clears the threshold. Returns (nodes, trail)."""
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


def mixed_precision_ab(result: core.Explanation, candidate: Path, reference: Path, data: Path, calibration: Path,
                       out: Path, device_classes: list[DeviceClass], policy, *, base_image: str | None = None,
                       ca_bundle: Path | None = None, seams=None, progress: Progress | None = None) -> dict:
    """Write the mixed-precision candidate to `out` and gate it and the INT8 candidate on the same tiers
    (tiergate.pipeline.gate; the mixed one with the INT8 candidate as its incumbent: the A/B): verdicts,
    whether each passes against the FP32 reference alone, the A/B checks, sizes, latency on real tiers."""
    from tiergate import pipeline

    if Path(calibration).resolve() == Path(data).resolve():
        _say(progress, "calibrating on the evaluation data, as asked (its accuracy figures are then optimistic)")
    settings = quant_settings(candidate)
    threshold = min((t.threshold_db for t in result.targets.values()), default=core.DEFAULT_THRESHOLD_DB)
    with tempfile.TemporaryDirectory(prefix="tiergate-mixed-") as tmp:
        _say(progress, "re-quantizing the reference with the worst layers kept in float")
        exclude, trail = choose_exclusions(result, reference, data, calibration, settings, Path(tmp), threshold)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(tmp) / f"mixed-{len(trail) - 1}.onnx", out)
    _say(progress, "gating the INT8 candidate")
    int8 = pipeline.gate(Path(candidate), Path(reference), Path(data), device_classes, policy, base_image=base_image,
                         ca_bundle=ca_bundle, progress=progress, seams=seams)
    _say(progress, "gating the mixed-precision candidate against the INT8 one (A/B)")
    mixed = pipeline.gate(Path(out), Path(reference), Path(data), device_classes, policy, incumbent=Path(candidate),
                          base_image=base_image, ca_bundle=ca_bundle, progress=progress, seams=seams)
    return {"settings": settings, "trail": trail,
            "int8": _side(int8, Path(candidate), "candidate", device_classes, []),
            "mixed": _side(mixed, Path(out), "candidate", device_classes, exclude)}


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
            "size_bytes": path.stat().st_size, "latency_ms": latency, "excluded": excluded}
