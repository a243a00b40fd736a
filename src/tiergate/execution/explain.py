"""`tiergate explain`'s runs: each tier's runtime dumps the candidate's and the reference's tensors.

`explain(candidate, reference, data, device_classes, policy)` prepares the models
(tiergate.explain.plan), runs containers/harness/tiergate_explain.py once per device class in
the class's runtime image (the harness run's confinement: no network, read-only root,
non-root, the class's limits and timeout; the models, the script and the data travel in the
job's input volume, like the runtime describer), and pairs what each tier saw
(tiergate.explain.analyse). The dumps are cached under TIERGATE_HOME/explain/ by (candidate,
reference, data, image id, script, samples): a folder appears there only complete.

The runner is a seam: `DockerRunner` is the real one (its runtime image comes from the builder seam,
orchestrator.explain_ab.docker_runner); `HostRunner` runs the same script with this Python (tests, and a
quick look without Docker). What is made and gated of it (explain --fix) is orchestrator/explain_fix.py.
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from tiergate import explain as core
from tiergate.errors import InfrastructureFault, InputError, TiergateError
from tiergate.hashing import file_sha256
from tiergate import state
from tiergate.paths import containers_dir
from tiergate.targets import DeviceClass

SCRIPT = "harness/tiergate_explain.py"
INPUT_DIR = "/data"
CACHE_DIR = state.EXPLAIN
DEFAULT_SAMPLES = 32
Progress = Callable[[str], None]


def script_path() -> Path:
    return containers_dir() / SCRIPT


class Runner(Protocol):
    """Runs the dump script for one device class; fills `out` with explain.json and NAME.tK.npy files.
    `identity(dc)` names what runs (an image id), for the cache key."""

    def identity(self, dc: DeviceClass) -> str: ...

    def run(self, dc: DeviceClass, models: dict[str, Path], data: Path, samples: int, out: Path) -> None: ...


def dump_budget(dc: DeviceClass) -> int:
    """The most bytes a tier's dump may hold: the tier's memory limit (the script sizes its sample count to it)."""
    return dc.limits.memory_bytes


def script_args(dc: DeviceClass, data: str, out: str, samples: int, models: dict[str, str]) -> list[str]:
    """The dump script's arguments for one tier (the host's paths or the container's)."""
    args = ["--runtime", dc.runtime, "--data", data, "--out", out, "--max-samples", str(samples),
            "--max-bytes", str(dump_budget(dc)), "--threads", str(dc.threads)]
    for name, path in models.items():
        args += ["--model", f"{name}={path}"]
    return args


class HostRunner:
    """The dump script with this machine's Python and runtime (no container, no tier: tests, quick looks)."""

    def identity(self, dc: DeviceClass) -> str:
        return f"host-{sys.executable}"

    def run(self, dc, models, data, samples, out) -> None:
        cmd = [sys.executable, "-s", str(script_path()),
               *script_args(dc, str(data), str(out), samples, {name: str(path) for name, path in models.items()})]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=dc.limits.timeout_s)
        if not (out / "explain.json").is_file():
            raise DumpFailed(f"{dc.name}: the tensor dump failed: {_last(done.stderr) or done.returncode}")


class DockerRunner:
    """The dump script inside the device class's runtime image, which the builder seam provides
    (orchestrator.DockerBuilder.runtime_image: built once, like a harness run's)."""

    def __init__(self, runtime_image: Callable[..., tuple[str, str]]):
        self.runtime_image = runtime_image          # (device class, client) -> (tag, image id): the builder's
        self._images: dict[str, str] = {}

    def _client(self, dc):
        from tiergate.execution.engine import connect, with_retries

        return with_retries(lambda: connect(dc.docker_host), what=f"connecting to {dc.docker_host}")

    def image(self, dc: DeviceClass, client) -> tuple[str, str]:
        return self.runtime_image(dc, client)

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
        from tiergate.execution.base import Job, last_line, python_entrypoint
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
            command = script_args(dc, f"{INPUT_DIR}/data.npz", "/out", samples,
                                  {name: f"{INPUT_DIR}/{name}{path.suffix}" for name, path in models.items()})
            spec.update(entrypoint=python_entrypoint(dc, f"{INPUT_DIR}/tiergate_explain.py"), command=command)
            container = client.containers.create(**spec)
            try:
                reason, log_tail, oom = _run(container, job)
                if not oom:
                    _download(container, out)
            finally:
                container.remove(force=True)
        if oom:      # the tier's own limit, not the engine: said as such, never retried as a fault
            raise DumpFailed(f"{dc.name}: the tensor dump ran out of memory: {reason} (a sample's tensors and the "
                             f"runtime's own memory must fit; --samples does not change that)")
        if (out / "explain.json").is_file():
            return
        raise_for = InputError if reason and "exited with code" in reason else InfrastructureFault
        raise raise_for(f"{dc.name}: the tensor dump failed in {tag}: {reason or 'no explain.json'} "
                        f"({last_line(log_tail) or 'no output'})")


class DumpFailed(TiergateError):
    """A tier's dump could not be made (its memory limit, its runtime's refusal): exit 2, with the reason."""


def _download(container, out: Path) -> None:
    from tiergate.execution.docker_backend import download

    download(container, out, lambda name: name == "explain.json" or name.endswith(".npy"))


def _last(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- the whole explain ------------------------------------------------------------------


def explain(candidate: Path, reference: Path, data_path: Path | str, device_classes: list[DeviceClass], policy=None,
            *, runner: Runner, samples: int = DEFAULT_SAMPLES, threshold_db: float | None = None,
            progress: Progress | None = None, sample_axes: dict[str, int] | None = None) -> core.Explanation:
    """Every device class's explanation of the candidate against its FP32 reference (`sample_axes`: --sample-axis,
    as the gate takes it)."""
    from tiergate.artifact import load_artifact
    from tiergate.evaldata import AXES_MEMBER, take, validate_against

    if samples < 1:
        raise InputError("--samples must be at least 1")
    cand_art, ref_art = load_artifact(candidate), load_artifact(reference)
    for dc in device_classes:
        if dc.runtime == "ethos-u":      # not wired (docs/npu.md): its outputs are the reference kernels'
            raise InputError(f"device class {dc.name} is an NPU tier: explain does not dump its reference kernels' "
                             "tensors; name a LiteRT class (x86_64-cpu-tflite)")
        if dc.compiled:      # a compiled library has no intermediate tensors to dump (docs/tvm.md)
            raise InputError(f"device class {dc.name} runs a compiled library ({dc.runtime}): explain dumps "
                             "intermediate tensors that only an interpreting runtime has; name another class")
        for art in (cand_art, ref_art):
            if art.format != dc.artifact_format:
                raise InputError(f"{art.path}: is {art.format}, but device class {dc.name} runs {dc.runtime}")
    data = eval_data(data_path, ref_art.inputs, sample_axes)
    validate_against(data, _float_fed(cand_art, ref_art))
    n = min(samples, data.n_samples)
    # each sample as the model takes it (its sample axis kept, length 1; a constant such as silero's `sr` whole):
    # what the dump script feeds, and what fixes an If's condition when the plan specializes a model
    feeds = [{name: np.asarray(take(data.arrays[name], data.axis(name), s, s + 1)) for name in data.info}
             for s in range(n)]
    inputs = {name: np.stack([feed[name] for feed in feeds]) for name in data.info}
    out = core.Explanation(str(candidate), str(reference))
    with tempfile.TemporaryDirectory(prefix="tiergate-explain-") as tmp:
        plan = core.plan(Path(candidate), Path(reference), Path(tmp), feeds)
        models = {"candidate": plan.candidate, "reference": plan.reference}
        # the dump script reads one array per input, the first n samples along its sample axis (the axes in the
        # archive's AXES_MEMBER, as the harness reads them), without an archive's own members
        feed = Path(tmp) / "data.npz"
        axes = {name: data.axis(name) for name in data.info}
        np.savez(feed, **{name: np.asarray(take(data.arrays[name], axes[name], 0, n)) for name in data.info},
                 **{AXES_MEMBER: np.array(json.dumps({"inputs": axes}))})
        for dc in device_classes:
            limit = threshold_db if threshold_db is not None else _threshold(policy, dc)
            _say(progress, f"dumping tensors on {dc.name}")
            t0 = time.monotonic()
            try:
                folder = _dump(runner, dc, models, cand_art.sha256, ref_art.sha256, data.sha256, feed, n)
            except DumpFailed as exc:        # this tier's dump could not be made: said, the other tiers go on
                out.targets[dc.name] = core.TierExplain(dc.name, limit, error=exc.one_line())
                continue
            except InputError:
                raise
            except TiergateError as exc:
                out.targets[dc.name] = core.TierExplain(dc.name, limit, error=exc.one_line())
                continue
            dumps, meta = load_dumps(folder)
            dumped = int(meta.get("samples") or n)       # the script sized it to the tier's memory
            meta["inputs"] = {name: array[:dumped] for name, array in inputs.items()}
            meta.setdefault("seconds", time.monotonic() - t0)
            if meta.get("error"):
                out.targets[dc.name] = core.TierExplain(dc.name, limit, error=meta["error"],
                                                        machine=meta.get("machine", ""))
                continue
            out.targets[dc.name] = item = core.analyse(plan, dc.name, dumps, threshold_db=limit, meta=meta)
            item.seconds, item.samples = time.monotonic() - t0, dumped
            item.sample_bytes, item.peak_bytes = int(meta["bytes_per_sample"] or 0), int(meta["peak_rss_bytes"] or 0)
            if dumped < n:
                item.samples_note = (f"{item.samples} of {n} samples: a sample's tensors hold "
                                     f"{_mb(meta.get('bytes_per_sample', 0))} on {dc.name}, and the dump is sized to "
                                     f"its memory limit ({_mb(dump_budget(dc))})")
    return out


def eval_data(source: Path | str, inputs: list, sample_axes: dict[str, int] | None = None):
    """The evaluation data in any form the gate takes: an .npz, or a loader FILE.py:FUNCTION run once and
    materialised into a content-hashed archive (tiergate.dataloader.run_loader, as the gate does)."""
    from tiergate.dataloader import run_loader
    from tiergate.evaldata import is_loader, load_eval_data

    if is_loader(source):
        return run_loader(str(source), inputs, sample_axes)
    return load_eval_data(source, None if sample_axes is None else inputs, sample_axes)


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
    # the models as dumped (the tensors the pairing exposes) are in the key: a new pairing never reads old dumps;
    # so is the tier's memory, which sizes the sample count
    key_text = "\0".join((cand_sha, ref_sha, data_sha, runner.identity(dc), dc.name, str(dump_budget(dc)),
                          file_sha256(script_path()), str(n), *(file_sha256(p) for p in models.values())))
    key = hashlib.sha256(key_text.encode()).hexdigest()[:24]
    folder = state.explain_folder(key)
    if state.cached_folder(folder, "explain dump"):        # a sealed manifest: truncated or edited is made again
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = state.part_path(folder)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    t0 = time.monotonic()
    try:
        runner.run(dc, models, Path(data_path), n, work)
        doc = json.loads((work / "explain.json").read_text())
        doc["host_seconds"] = round(time.monotonic() - t0, 3)
        (work / "explain.json").write_text(json.dumps(doc))
        if not doc.get("ok"):        # a refusal is not cached: the next explain asks again
            target = state.part_path(folder.with_name(f"{key}.failed"))
            shutil.rmtree(target, ignore_errors=True)
            work.rename(target)
            return target
        state.publish_folder(work, folder)
        return folder
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _mb(size: int) -> str:
    return f"{size / 2 ** 20:,.0f} MB"


class Dump(Mapping):
    """One model's dumped tensors by name, each read from its file when asked for and not kept: the pairing holds
    one pair at a time, so the host's memory is bounded by the largest tensor, never the dump."""

    def __init__(self, files: dict[str, Path]):
        self.files = files

    def __getitem__(self, tensor: str) -> np.ndarray:
        return np.load(self.files[tensor], allow_pickle=False)

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def load_dumps(folder: Path) -> tuple[dict[str, dict[str, np.ndarray]], dict]:
    """({"candidate": {tensor: array}, "reference": {...}}, meta) from a dump folder (`Dump`: each tensor read from
    its file when the pairing asks for it)."""
    doc = json.loads((folder / "explain.json").read_text())
    dumps, meta = {}, {"machine": doc.get("machine", ""), "seconds": doc.get("host_seconds", 0.0),
                       "error": doc.get("error", ""), "samples": doc.get("samples"),
                       "bytes_per_sample": doc.get("bytes_per_sample", 0), "peak_rss_bytes": doc.get("peak_rss_bytes", 0)}
    for name, entry in doc.get("models", {}).items():
        files = {_unsuffixed(tensor): folder / f"{name}.{key}.npy" for key, tensor in entry.get("tensors", {}).items()}
        dumps[name] = Dump({tensor: path for tensor, path in files.items() if path.is_file()})
        meta[f"{name}_quant"] = entry.get("quant", {})
        meta[f"{name}_ops"] = entry.get("ops", {})
        meta[f"{name}_outputs"] = entry.get("outputs", [])
        meta[f"{name}_graph"] = entry.get("graph") or {}     # TFLite: the graph the interpreter built
        meta[f"{name}_overwritten"] = entry.get("overwritten") or {}   # TFLite: inputs an op ran in place over
    return dumps, meta


# onnxruntime's modify_model_output_intermediate_tensors exposes tensor T flattened, as T + this
_SAVED_SUFFIX = "_ReshapedSavedOutput"


def _unsuffixed(name: str) -> str:
    return name[: -len(_SAVED_SUFFIX)] if name.endswith(_SAVED_SUFFIX) else name


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)
