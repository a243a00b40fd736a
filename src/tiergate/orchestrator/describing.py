"""What each tier's runtime really executes of the candidate: described once per tier, in its run step."""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any

from tiergate.errors import InfrastructureFault, TiergateError
from tiergate.lint import Finding
from tiergate.orchestrator.types import Progress, RunSpec, say


class Describing:
    """Each tier's candidate described once (describe_candidate), in the tier's run step and within the run
    slots: a tier's runtime graph is made while other tiers run (an emulated tier's describe, seconds under QEMU,
    beside a native tier's runs), never more containers at once than --max-parallel. `done`: class -> result."""

    def __init__(self, builder, progress: Progress | None = None):
        self.builder, self.progress = builder, progress
        self.done: dict[str, Any] = {}
        self._guard = threading.Lock()

    def __call__(self, group: list[RunSpec], slots=None) -> None:
        name = group[0].device_class.name
        with self._guard:
            if name in self.done or not any(s.role == "candidate" for s in group):
                return
            self.done[name] = None                      # claimed: described once, whoever asks again
        try:
            with slots if slots is not None else nullcontext():
                self.done[name] = describe_candidate(group, self.builder, progress=self.progress)
        except BaseException:
            with self._guard:
                del self.done[name]                     # a retried step describes it again
            raise


def describe_candidate(group: list[RunSpec], builder, *, progress: Progress | None = None):
    """The candidate's runtime graph and its findings on one device class, or None (no image, no describer)."""
    describe = getattr(builder, "describe", None)
    spec = next((s for s in group if s.role == "candidate"), None)
    if describe is None or spec is None or spec.image is None:
        return None
    say(progress, f"runtime graph of the candidate on {spec.device_class.name}")
    try:
        return describe(spec.device_class, spec.intake, spec.image)
    except InfrastructureFault as exc:
        from tiergate.execution.engine import engine_problem

        name = spec.device_class.name
        problem = engine_problem(spec.device_class.docker_host)
        if problem:
            raise InfrastructureFault(f"on {name}: describing the candidate failed and the engine is gone: "
                                      f"{problem}") from exc
        raise InfrastructureFault(f"on {name}: {exc.message}", hint=exc.hint) from exc
    except TiergateError as exc:
        return ({"target": spec.device_class.name, "ok": False, "error": exc.one_line()},
                [Finding("runtime-graph", "warning", f"could not describe the runtime graph on "
                         f"{spec.device_class.name}: {exc.one_line()}", basis="runtime",
                         target=spec.device_class.name)])
