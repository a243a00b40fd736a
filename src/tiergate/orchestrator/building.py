"""Building: the image of each spec (or the reason it cannot be built)."""

from __future__ import annotations

import dataclasses
import difflib

from tiergate import leases, state
from tiergate.errors import EnvironmentProblem, InputError, TiergateError
from tiergate.images import COMPILE_KEY_LABEL, LABEL
from tiergate.orchestrator.types import Progress, RunSpec, say


def build_images(specs: list[RunSpec], builder, *, progress: Progress | None = None,
                 input_shapes: dict | None = None) -> list[RunSpec]:
    """Build (or reuse) the image of each spec; an artifact that cannot be built fails that spec only,
    an environment problem (engine, base image, pip) raises. `input_shapes` (EvalData.call_shapes) reach the
    builder on the intake of a class that compiles the artifact (Intake.input_shapes). A compiled class's candidate
    with passes switched off is built after the reference, whose compile record names the passes there are: a
    mistyped name is refused before the candidate is compiled (and cached) with it."""
    first = [s for s in specs if s.role == "reference"] if _extra_passes(specs) else []
    for spec in first + [s for s in specs if s not in first]:
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
        if spec in first:
            check_disabled_passes(specs)
    check_disabled_passes(specs)
    return specs


def _extra_passes(specs: list[RunSpec]) -> bool:
    """The candidate's class compiles and switches passes off beyond the reference's (--disable-pass, bisect)."""
    by_role = {spec.role: spec for spec in specs}
    candidate, reference = by_role.get("candidate"), by_role.get("reference")
    return candidate is not None and reference is not None and candidate.device_class.compiled and \
        bool(set(candidate.device_class.disabled_passes) - set(reference.device_class.disabled_passes))


def check_disabled_passes(specs: list[RunSpec]) -> None:
    """A compiled class's candidate with passes switched off beyond the class's own (--disable-pass, bisect): each
    name must be a pass the compiler applied to the reference on that class (its compile record), else InputError
    (exit 2): TVM ignores an unknown name, so a typo would switch nothing off and the gate would say nothing."""
    by_role = {spec.role: spec for spec in specs}
    candidate, reference = by_role.get("candidate"), by_role.get("reference")
    if candidate is None or reference is None or not candidate.device_class.compiled or reference.image is None:
        return
    extra = sorted(set(candidate.device_class.disabled_passes) - set(reference.device_class.disabled_passes))
    key = (reference.image.labels or {}).get(COMPILE_KEY_LABEL)
    record = state.compile_record(state.compiled_folder(key)) if extra and key else None
    if record is None:
        return
    applied = {p.get("name") for p in record.get("passes", []) if isinstance(p, dict)} - {None}
    for name in extra:
        if name not in applied:
            close = difflib.get_close_matches(name, sorted(applied), n=1)
            raise InputError(f"--disable-pass {name}: {reference.device_class.name}'s compiler applies no pass of "
                             f"that name to the reference" + (f" (did you mean {close[0]}?)" if close else
                                                              f" ({len(applied)} passes; tiergate inspect --target "
                                                              f"{reference.device_class.name} --json lists them)"))


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
