"""Building: the image of each spec (or the reason it cannot be built)."""

from __future__ import annotations

import dataclasses

from tiergate import leases
from tiergate.errors import EnvironmentProblem, TiergateError
from tiergate.images import LABEL
from tiergate.orchestrator.types import Progress, RunSpec, say


def build_images(specs: list[RunSpec], builder, *, progress: Progress | None = None,
                 input_shapes: dict | None = None) -> list[RunSpec]:
    """Build (or reuse) the image of each spec; an artifact that cannot be built fails that spec only,
    an environment problem (engine, base image, pip) raises. `input_shapes` (EvalData.call_shapes) reach the
    builder on the intake of a class that compiles the artifact (Intake.input_shapes)."""
    for spec in specs:
        say(progress, f"image for {spec.role} on {spec.device_class.name}")
        spec.image, spec.build_error = None, None
        item = spec.intake
        if input_shapes and spec.device_class.compiled:
            item = dataclasses.replace(item, input_shapes=input_shapes)
        try:
            with leases.using_images():    # found or built, and leased, before any gc can remove it
                spec.image = check_lineage(builder.build(spec.device_class, item), spec)
                leases.add(spec.image.tag, spec.image.image_id, spec.image.runtime_tag)
        except EnvironmentProblem:     # no engine, no base image, pip or docker build broken: exit 2, no verdict
            raise
        except TiergateError as exc:  # this artifact cannot be built for this class: that class's run fails
            spec.build_error = f"image build failed: {exc.one_line()}"
    return specs


def check_lineage(image, spec: RunSpec):
    """The image a builder returned, when the artifact it names (its `artifact.sha256` label) is the spec's: an
    image re-tagged under a candidate's tag is never run. A builder whose images carry no labels (a work pool's,
    built and checked on the worker) passes; a mismatch the builder did not repair is EnvironmentProblem (exit 2)."""
    named = (image.labels or {}).get(f"{LABEL}.artifact.sha256")
    if named is not None and named != spec.intake.sha256:
        raise EnvironmentProblem(f"the image {image.tag} for {spec.role} on {spec.device_class.name} holds another "
                                 f"artifact (sha256 {named[:12]}…, not {spec.intake.sha256[:12]}…)",
                                 hint="remove the image (docker rmi) and gate again")
    return image
