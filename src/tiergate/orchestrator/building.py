"""Building: the image of each spec (or the reason it cannot be built)."""

from __future__ import annotations

from tiergate import leases
from tiergate.errors import EnvironmentProblem, TiergateError
from tiergate.orchestrator.types import Progress, RunSpec, say


def build_images(specs: list[RunSpec], builder, *, progress: Progress | None = None) -> list[RunSpec]:
    """Build (or reuse) the image of each spec; an artifact that cannot be built fails that spec only,
    an environment problem (engine, base image, pip) raises."""
    for spec in specs:
        say(progress, f"image for {spec.role} on {spec.device_class.name}")
        spec.image, spec.build_error = None, None
        try:
            with leases.using_images():    # found or built, and leased, before any gc can remove it
                spec.image = builder.build(spec.device_class, spec.intake)
                leases.add(spec.image.tag, spec.image.image_id, spec.image.runtime_tag)
        except EnvironmentProblem:     # no engine, no base image, pip or docker build broken: exit 2, no verdict
            raise
        except TiergateError as exc:  # this artifact cannot be built for this class: that class's run fails
            spec.build_error = f"image build failed: {exc.one_line()}"
    return specs
