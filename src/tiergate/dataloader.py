"""Data loaders (`FILE.py:FUNCTION`, as Polygraphy's data-loader scripts): run once, here on the host, their
samples checked against the model's inputs and materialised into a content-hashed archive
(tiergate.evaldata.write_archive), so containers only ever see arrays. Also the one import of a user's
FILE.py:FUNCTION (`load_function`: loaders, metrics, recipes)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tiergate import labels as labels_mod
from tiergate.artifact.model import TensorSpec
from tiergate.errors import InputError
from tiergate.evaldata import EvalData, load_eval_data, model_sample_axis, shape_text, write_archive

# --- data loaders: FILE.py:FUNCTION -----------------------------------------------------------------


LOADER_MAX_SAMPLES_ENV = "TIERGATE_LOADER_MAX_SAMPLES"
LOADER_MAX_MB_ENV = "TIERGATE_LOADER_MAX_MB"
LOADER_MAX_SAMPLES = 1_000_000
LOADER_MAX_MB = 4096


def load_function(spec: str, what: str = "data loader"):
    """FUNCTION from FILE.py (imported once per call, as a fresh module); an InputError naming the spec.

    The import runs the file's top level: user code, run with limits (tiergate.usercode)."""
    from tiergate import usercode

    file, sep, function = str(spec).rpartition(":")
    if not sep or not file.endswith(".py") or not function.isidentifier():
        raise InputError(f"{what} {spec!r}: expected FILE.py:FUNCTION")
    path = Path(file)
    if not path.is_file():
        raise InputError(f"{what} {spec}: {file} does not exist")
    module_name = f"tiergate_user_{abs(hash(str(path.resolve())))}"
    try:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        usercode.call(f"{what} {spec}: importing {file}", module_spec.loader.exec_module, module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    fn = getattr(module, function, None)
    if not callable(fn):
        raise InputError(f"{what} {spec}: {file} defines no function {function}()")
    return fn


def run_loader(spec: str, inputs: list[TensorSpec], sample_axes: dict[str, int] | None = None) -> EvalData:
    """Run a loader once, here; its samples, checked against the model's inputs, as a content-hashed archive.

    The loader is user code run with limits (tiergate.usercode: sys.exit, stdout, a timeout per sample),
    and at most TIERGATE_LOADER_MAX_SAMPLES samples and TIERGATE_LOADER_MAX_MB of arrays are taken from it."""
    from tiergate import usercode

    fn = load_function(spec)
    where = f"data loader {spec}"
    max_samples = usercode.env_limit(LOADER_MAX_SAMPLES_ENV, LOADER_MAX_SAMPLES)
    max_bytes = usercode.env_limit(LOADER_MAX_MB_ENV, LOADER_MAX_MB) * 2 ** 20
    samples = usercode.iterate(where, fn, lambda i: f"{where}: sample {i}")
    explicit = dict(sample_axes or {})
    specs = {s.name: s for s in inputs}
    axes = {name: explicit.get(name, model_sample_axis(s)) for name, s in specs.items()}
    columns: dict[str, list[np.ndarray]] = {name: [] for name in specs}
    labels: list = []
    label_kinds: set[str] = set()
    index, held = -1, 0
    try:
        for index, sample in enumerate(samples):
            if index >= max_samples:
                raise InputError(f"{where}: yields more than {max_samples:,} samples, the limit "
                                 f"({LOADER_MAX_SAMPLES_ENV}); a loader must end")
            feed, label = _split_sample(where, index, sample)
            if (label is None) != (not labels) and index > 0:
                raise InputError(f"{where}: sample {index}: " + ("has a label but earlier samples have none"
                                 if label is not None else "has no label but earlier samples have one"))
            for name in feed:
                if name not in specs:
                    raise InputError(f"{where}: sample {index}: '{name}' is not a model input "
                                     f"(inputs: {', '.join(specs)})")
            for name, s in specs.items():
                if name not in feed:
                    raise InputError(f"{where}: sample {index}: model input '{name}' is missing "
                                     f"(sample has: {', '.join(feed) or 'nothing'})")
                array = _one_call(where, index, s, axes[name], feed[name], columns[name])
                if axes[name] is not None or not columns[name]:
                    held += array.nbytes
                columns[name].append(array)
            if label is not None:
                kind, value = labels_mod.loader_label(f"{where}: sample {index}", label)
                label_kinds.add(kind)
                if len(label_kinds) > 1:
                    raise InputError(f"{where}: sample {index}: its label is a {kind}, earlier samples' are not")
                labels.append(_label(where, index, value, labels) if kind == "number" else value)
                held += labels[-1].nbytes if kind == "number" else 64
            if held > max_bytes:
                raise InputError(f"{where}: sample {index}: its samples exceed {max_bytes // 2 ** 20:,} MB, the "
                                 f"limit ({LOADER_MAX_MB_ENV})")
    finally:
        samples.close()
    if index < 0:
        raise InputError(f"{where}: yielded no samples")
    arrays = {name: (column[0] if axes[name] is None else np.concatenate(column, axis=axes[name]))
              for name, column in columns.items()}
    if labels:
        arrays |= labels_mod.members(labels_mod.collect(label_kinds.pop(), labels))
    meta = {"inputs": axes, "outputs": {k: v for k, v in explicit.items() if k not in specs},
            "source": str(spec)}
    # the source names the loader in messages; it is part of the hash only through the samples' bytes
    path = write_archive(arrays, {**meta, "source": Path(str(spec).rpartition(":")[0]).name + ":"
                                  + str(spec).rpartition(":")[2]})
    return load_eval_data(path)


def _split_sample(where: str, index: int, sample):
    label = None
    if isinstance(sample, (tuple, list)) and len(sample) == 2 and isinstance(sample[0], Mapping):
        sample, label = sample
    if not isinstance(sample, Mapping):
        raise InputError(f"{where}: sample {index}: expected a dict {{input name: array}} or a pair "
                         f"(dict, label), got {type(sample).__name__}")
    return dict(sample), label


def _one_call(where: str, index: int, spec: TensorSpec, axis: int | None, value, column: list) -> np.ndarray:
    name = f"sample {index}: input '{spec.name}'"
    try:
        array = np.asarray(value)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{where}: {name}: not an array ({type(exc).__name__}: {exc})") from None
    if array.dtype.hasobject or array.dtype.name != spec.dtype:
        raise InputError(f"{where}: {name} has dtype {array.dtype}, the model wants {spec.dtype}")
    wanted = shape_text(spec.shape, axis).replace("N", "1")
    if axis is None:
        if array.shape != tuple(spec.shape):
            raise InputError(f"{where}: {name} has shape {array.shape}, the model wants {wanted}")
        if column and not np.array_equal(column[0], array):
            raise InputError(f"{where}: {name} differs from sample 0's, but the model input has no sample axis "
                             "(a 0-d input is one constant for every call)")
        return array
    if array.ndim == len(spec.shape) - 1:
        array = np.expand_dims(array, axis)
    if array.ndim != len(spec.shape) or array.shape[axis] != 1:
        raise InputError(f"{where}: {name} has shape {array.shape}, one call's is {wanted} "
                         f"(sample axis {axis} of size 1, or left out)")
    for i, (have, want) in enumerate(zip(array.shape, spec.shape)):
        if i != axis and isinstance(want, int) and want > 0 and have != want:
            raise InputError(f"{where}: {name} has shape {array.shape}, one call's is {wanted} "
                             f"(axis {i} is {have}, must be {want})")
    if column and column[0].shape != array.shape:
        raise InputError(f"{where}: {name} has shape {array.shape} but sample 0's is {column[0].shape}: "
                         "samples must agree off the sample axis")
    return array


def _label(where: str, index: int, label, labels: list) -> np.ndarray:
    try:
        array = np.asarray(label)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{where}: sample {index}: label is not an array ({exc})") from None
    if array.dtype.hasobject or not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise InputError(f"{where}: sample {index}: label has dtype {array.dtype}; labels must be numbers")
    if labels and (labels[0].shape != array.shape or labels[0].dtype != array.dtype):
        raise InputError(f"{where}: sample {index}: label {array.dtype}{list(array.shape)} differs from sample 0's "
                         f"{labels[0].dtype}{list(labels[0].shape)}")
    return array
