"""The evaluation set and the outputs' arrays (tiergate_harness.py's core loop; numpy only).

`load_data` reads the archive tiergate's evaldata wrote: one array per model input, an optional `labels` array
(never fed) and `__tiergate_axes__` (JSON: {"inputs": {name: axis or null}, "outputs": {name: axis}}). An input's
samples are sliced along its axis (`take`); a null axis (a 0-d array) is a constant fed whole to every call.
`batch_for` and `slices` cut the samples into calls. `Outputs` copies each call's outputs into arrays allocated
once, outside the timed region, sample axis first: an output's sample axis is the one given, else the axis of an
input whose per-call shape it has, else the first axis of the call's batch size (`sample_axes`).
"""

from __future__ import annotations

import json

import numpy as np

LABELS = "labels"
AXES_MEMBER = "__tiergate_axes__"


def load_data(path, samples=""):
    """(arrays by input name, sample count, {"inputs": axes, "outputs": axes}); `samples` "START:STOP" keeps
    that range of every input along its sample axis."""
    with np.load(path, allow_pickle=False) as npz:
        data = {name: npz[name] for name in npz.files if name not in (LABELS, AXES_MEMBER)}
        meta = json.loads(str(npz[AXES_MEMBER][()])) if AXES_MEMBER in npz.files else {}
    if not data:
        raise SystemExit(f"harness: {path}: no input arrays")
    axes = {name: meta.get("inputs", {}).get(name, 0 if a.ndim else None) for name, a in data.items()}
    sizes = {a.shape[axes[name]] for name, a in data.items() if axes[name] is not None}
    if len(sizes) != 1:
        raise SystemExit(f"harness: {path}: inputs differ in sample count {sorted(sizes)}")
    n = sizes.pop()
    if samples:
        start, stop = (int(x) for x in samples.split(":"))
        if not 0 <= start < stop <= n:
            raise SystemExit(f"harness: --samples {samples}: not a range of the data's {n} samples")
        data = {name: take(a, axes[name], start, stop) for name, a in data.items()}
        n = stop - start
    return data, n, {"inputs": axes, "outputs": meta.get("outputs", {})}


def take(array, axis, start, stop):
    """Samples [start, stop) along `axis`, contiguous; a constant (axis None) whole."""
    if axis is None:
        return array
    return np.ascontiguousarray(array[(slice(None),) * axis + (slice(start, stop),)])


def batch_for(dim0, wanted):
    """A fixed leading dimension decides the batch; a symbolic one takes the device class's."""
    return dim0 if isinstance(dim0, int) and dim0 > 0 else wanted


def slices(n, batch):
    return [(start, min(start + batch, n)) for start in range(0, n, batch)]


def sample_axes(data, axes, span):
    """Per output: its sample axis from the first call's output (see the module's docstring)."""
    size = span[1] - span[0]
    calls = [(take(a, axes["inputs"][name], *span).shape, axes["inputs"][name]) for name, a in data.items()
             if axes["inputs"][name] is not None]
    given = axes.get("outputs", {})

    def axis_of(name, out):
        if name in given:
            return given[name]
        for shape, axis in calls:
            if out.shape == shape:
                return axis
        for axis, dim in enumerate(out.shape):
            if dim == size:
                return axis
        raise SystemExit(f"harness: output {name!r} {out.shape} has no axis of the call's {size} samples")
    return axis_of


class Outputs:
    """Each call's outputs copied into arrays allocated once, outside the timed region (sample axis first); the
    calls may come from several threads, in any order. `axes_for(span)`: the function naming each output's sample
    axis from a call over `span` (sample_axes)."""

    def __init__(self, spans, names, axes_for=None):
        import threading

        self.spans, self.names, self.buffers, self.axes = spans, names, None, None
        self.axes_for = axes_for or (lambda span: (lambda name, o: 0))
        self.made = threading.Lock()        # concurrent calls (concurrent_calls): the buffers are made once

    def __call__(self, i, outs):
        start, stop = self.spans[i]
        if self.buffers is None:
            with self.made:
                if self.buffers is None:
                    self._make(outs, self.spans[i])
        for buffer, o, axis in zip(self.buffers, outs, self.axes):
            buffer[start:stop] = np.moveaxis(o, axis, 0) if axis else o

    def _make(self, outs, span):
        axis_of = self.axes_for(span)
        axes = [axis_of(name, o) if o.ndim else None for name, o in zip(self.names, outs)]
        for name, o, axis in zip(self.names, outs, axes):
            if axis is None or o.shape[axis] != span[1] - span[0]:
                raise SystemExit(f"harness: output {name!r} {o.shape} has no sample axis")
        self.axes = axes
        self.buffers = [np.empty((self.spans[-1][1], *np.delete(o.shape, axis)), o.dtype)
                        for o, axis in zip(outs, axes)]

    def arrays(self):
        return dict(zip(self.names, self.buffers))
