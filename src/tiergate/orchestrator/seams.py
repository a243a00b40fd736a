"""The seams the orchestrator calls out to: a builder, a backend per device class, a step runner, a janitor.

- a `Builder` makes (or finds) the image of one artifact for one device class (`DockerBuilder` is the real
  one, tiergate.build; it alone holds the build settings: base image, CA bundle);
- a backend (`tiergate.execution.base.Backend`, chosen per device class by `backend_for`) runs jobs and
  leaves their result folders;
- a `Steps` runner maps a step over items: threads here (`ThreadSteps`); the Prefect flows pass one that
  submits each item as a task (orchestration/gating.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field
from typing import Any, Protocol

from tiergate.errors import Interrupted
from tiergate.execution import janitor
from tiergate.images import BuiltImage
from tiergate.orchestrator.types import Intake
from tiergate.request import BuildSettings
from tiergate.targets import DeviceClass


class Builder(Protocol):
    """Makes or finds the image that runs one artifact on one device class; raises TiergateError if it cannot.

    Optionally `describe(device_class, intake, image) -> (runtime graph JSON, findings)`: what the
    class's runtime really executes of the artifact (runtime truth at intake), or None.
    """

    def build(self, device_class: DeviceClass, intake: Intake) -> BuiltImage: ...


@dataclass
class DockerBuilder:
    """The real builder: tiergate.build (runtime image + the artifact as the last layer)."""

    settings: BuildSettings = field(default_factory=BuildSettings)

    def __post_init__(self) -> None:
        if self.settings.ca_bundle is not None:     # a bad CA bundle is the user's input: refused before anything
            from tiergate.build import ca_bundle_bytes

            ca_bundle_bytes(self.settings.ca_bundle)

    def build(self, device_class: DeviceClass, intake: Intake) -> BuiltImage:
        from tiergate.build import build_image

        compiled = self._compiled(device_class, intake) if device_class.compiled else None
        return build_image(device_class, intake.artifact.path, artifact_sha256=intake.sha256,
                           fingerprint=intake.fingerprint.combined, base_image=self.settings.base_image,
                           ca_bundle=self.settings.ca_bundle, files=compiled.files if compiled else None,
                           extra_labels=compiled.labels if compiled else None)

    def _compiled(self, device_class: DeviceClass, intake: Intake):
        """The artifact compiled for the class (tiergate.build.compiling), at the data's input shapes (intake.input_shapes,
        set by the building stage)."""
        from tiergate.build.compiling import compiled

        return compiled(device_class, intake.artifact, input_shapes=intake.input_shapes,
                        ca_bundle=self.settings.ca_bundle)

    def runtime_image(self, device_class: DeviceClass, client=None) -> tuple[str, str]:
        """(tag, image id) of the class's runtime image (no artifact layer), built when missing."""
        from tiergate.build import ensure_runtime_image

        runtime = ensure_runtime_image(device_class, client=client, base_image=self.settings.base_image,
                                       ca_bundle=self.settings.ca_bundle)
        return runtime.tag, runtime.image_id

    def describe(self, device_class: DeviceClass, intake: Intake, image: BuiltImage):
        """The runtime graph of the artifact in the class's runtime image (cached by artifact and image); for a
        compiled artifact, what its compile recorded (tiergate.build.compiling)."""
        if device_class.compiled:
            from tiergate.build.compiling import compiled_graph
            from tiergate.lint import lint

            graph = compiled_graph(device_class, intake.artifact, image)
            return graph.to_json(), lint(intake.artifact, device_class, runtime=graph)
        from tiergate.execution.describe import runtime_intake

        graph, findings = runtime_intake(intake.artifact, device_class, image.runtime_tag or image.tag)
        return graph.to_json(), findings


def default_backend_for(device_class: DeviceClass):
    from tiergate.execution.run import backend_for

    return backend_for(device_class)


class Steps(Protocol):
    """Maps one step over items; returns results in order, raising the first failure once all have ended."""

    def map(self, step: str, fn: Callable[[Any], Any], items: list, *, limit: int | None = None,
            name: Callable[[Any], str] = str) -> list: ...


class ThreadSteps:
    """Steps on a thread pool (the CLI and the demo).

    On an interrupt (a signal handled in the main thread) nothing queued starts, and the
    running items get `grace_s` to end (their containers are already gone) before it goes on.
    """

    grace_s = 10.0

    def map(self, step, fn, items, *, limit=None, name=str) -> list:
        if not items:
            return []
        pool = ThreadPoolExecutor(max_workers=max(1, min(limit or len(items), len(items))),
                                  thread_name_prefix=f"tiergate-{step}")
        futures = [pool.submit(fn, item) for item in items]
        try:
            wait_all(futures)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            wait_all(futures, timeout=self.grace_s)
            raise
        pool.shutdown(wait=True)
        stopped = [f for f in futures if not f.cancelled() and isinstance(f.exception(), Interrupted)]
        if stopped:
            raise stopped[0].exception()
        return [future.result() for future in futures]


def default_janitor(device_classes: list[DeviceClass]) -> None:
    """Remove containers and volumes left by killed gates on the engines these classes use."""
    hosts = {dc.docker_host or "local" for dc in device_classes if dc.execution != "local"}
    if hosts:
        swept = janitor.sweep(hosts)
        if swept.containers or swept.volumes:
            print(f"tiergate: warning: removed what killed gates left: {swept.text()}", file=sys.stderr)


@dataclass
class Seams:
    """What the orchestrator calls out to; the defaults are the real parts (a DockerBuilder with default
    build settings when `builder` is None)."""

    builder: Builder | None = None
    backend_for: Callable[[DeviceClass], Any] = default_backend_for
    steps: Steps = field(default_factory=ThreadSteps)
    janitor: Callable[[list[DeviceClass]], Any] = default_janitor

    def the_builder(self) -> Builder:
        if self.builder is None:
            self.builder = DockerBuilder()
        return self.builder
