"""One gate through the orchestrator from the tests' usual arguments: the artifacts, the data, the classes and the
policy, with request fields and run options as keywords (tiergate.request.GateRequest, RunOptions)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from tiergate import orchestrator
from tiergate.request import GateRequest, RunOptions


def request(candidate, reference, data, device_classes, policy, *, incumbent=None, sample_axes=None, metrics=None,
            profile=False, early_stop=None) -> GateRequest:
    axes = sample_axes.items() if isinstance(sample_axes, dict) else ()
    return GateRequest(Path(candidate), Path(reference), str(data), tuple(device_classes), policy,
                       incumbent=None if incumbent is None else Path(incumbent), metrics=tuple(metrics or ()),
                       sample_axes=tuple(f"{name}={axis}" for name, axis in axes), profile=profile,
                       early_stop=early_stop)


def gate(candidate, reference, data, device_classes, policy, *, seams=None, registry=None, root=None,
         max_parallel=2, progress=None, shards=None, **fields):
    """orchestrator.gate(request(...), seams, RunOptions(...))."""
    options = RunOptions(registry=registry, max_parallel=max_parallel, shards=shards, progress=progress, root=root)
    return orchestrator.gate(request(candidate, reference, data, device_classes, policy, **fields), seams, options)


def fake_cli_seams(monkeypatch, builder, backend) -> None:
    """`tiergate gate` (the CLI) runs its gates on these seams: the orchestrator's gate is given them."""
    real_gate = orchestrator.gate

    def gate(request, seams=None, options=None):
        return real_gate(request, orchestrator.Seams(builder=builder, backend_for=backend), options)

    monkeypatch.setattr(orchestrator, "gate", gate)


def tiny_pair(folder: Path) -> tuple[Path, Path, Path]:
    """(candidate, reference, data): a 4-in 3-out softmax classifier, a twin that differs by 1e-5, 32 samples."""
    import numpy as np

    import modelkit

    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3))
    ref = modelkit.write(modelkit.linear(w, softmax=True), folder / "ref.onnx")
    cand = modelkit.write(modelkit.linear(w + 1e-5, softmax=True), folder / "cand.onnx")
    data = folder / "eval.npz"
    np.savez(data, x=rng.normal(size=(32, 4)).astype(np.float32))
    return cand, ref, data


@contextlib.contextmanager
def home_at(home: Path):
    """TIERGATE_HOME set to `home` for a fixture wider than a test (a module's, a session's), restored after."""
    saved = os.environ.get("TIERGATE_HOME")
    os.environ["TIERGATE_HOME"] = str(home)
    try:
        yield home
    finally:
        if saved is None:
            os.environ.pop("TIERGATE_HOME", None)
        else:
            os.environ["TIERGATE_HOME"] = saved


def steps_once_running(wait_class: str, running, timeout_s: float = 300):
    """The CLI's thread steps, except that `wait_class`'s run step starts only once running() is true (e.g. one of
    another class's containers runs): a test's order made, not raced."""
    import time

    from tiergate.orchestrator.seams import ThreadSteps

    seen: list[str] = []

    class OnceRunning(ThreadSteps):
        def map(self, step, fn, items, **kw):
            def gated(group):
                if step == "run" and group[0].device_class.name == wait_class:
                    deadline = time.monotonic() + timeout_s
                    while not running():
                        assert time.monotonic() < deadline, f"{wait_class}: what it waits for never ran"
                        time.sleep(0.1)
                    seen.append("running")
                return fn(group)
            return super().map(step, gated, items, **kw)

    steps = OnceRunning()
    steps.seen = seen
    return steps
