"""What each tier's runtime really executes of the candidate: described once per tier, in its run step."""

from __future__ import annotations

import threading
from pathlib import Path
from contextlib import nullcontext
from typing import Any

from tiergate.errors import InfrastructureFault, TiergateError
from tiergate.lint import Finding
from tiergate.orchestrator.types import Progress, RunSpec, say


class Describing:
    """Each tier's candidate described once, in the tier's run step: by the candidate's own run where it starts
    one (the harness describes it in the run's container after its result is written: no container, interpreter
    or runtime import of its own), or read from the candidate's cached run folder when an earlier run described
    it; else in a container of its own (describe_candidate, within the run slots). `done`: class -> result."""

    def __init__(self, builder, progress: Progress | None = None):
        self.builder, self.progress = builder, progress
        self.done: dict[str, Any] = {}
        self._guard = threading.Lock()

    def claim(self, group: list[RunSpec]) -> bool:
        """Whether this step describes the group's class (once per class, by the builder's describer)."""
        name = group[0].device_class.name
        with self._guard:
            if (name in self.done or getattr(self.builder, "describe", None) is None
                    or not any(s.role == "candidate" and s.image is not None for s in group)):
                return False
            self.done[name] = None                      # claimed: described once, whoever asks again
            return True

    def release(self, group: list[RunSpec]) -> None:
        """A failed step's claim given back: a retried step describes it again."""
        with self._guard:
            self.done.pop(group[0].device_class.name, None)

    def after_runs(self, group: list[RunSpec], done: list, slots=None) -> None:
        """The claimed class's description: from the candidate's run folder, else in a container of its own."""
        name = group[0].device_class.name
        spec, folder = next((s, d.folder) for s, d in zip(group, done) if s.role == "candidate")
        item = from_run(spec, folder, cached=not any(d.started for s, d in zip(group, done) if s is spec))
        if item is None:
            with slots if slots is not None else nullcontext():
                item = describe_candidate(group, self.builder, progress=self.progress)
        self.done[name] = item


def from_run(spec: RunSpec, folder: Path, cached: bool = False):
    """(RuntimeGraph JSON, findings) from the describe a run made of its artifact (harness --describe), or None when
    the folder holds none (a run that failed, or one described apart)."""
    from tiergate import results
    from tiergate.lint import lint
    from tiergate.runtime_graph import DESCRIBE_FILE, parse_describe

    if not (Path(folder) / DESCRIBE_FILE).is_file():
        return None
    dc = spec.device_class
    try:
        graph = parse_describe(folder, target=dc.name, tier=dc.tier, runtime=dc.runtime, emulated=dc.emulated,
                               image=spec.image.runtime_tag or spec.image.tag, image_id=results.load(folder).image_id,
                               artifact_sha256=spec.intake.sha256, cached=cached,       # seconds: its sessions
                               source=Path(spec.intake.artifact.path))                   # its ONNX external data
    except (TiergateError, OSError, ValueError, KeyError, TypeError):
        return None                                    # unreadable: described apart instead
    return graph.to_json(), lint(spec.intake.artifact, dc, runtime=graph)


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
