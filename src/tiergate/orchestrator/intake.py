"""Intake: load, fingerprint and lint each artifact; the evaluation data fitted to the reference; the checks
that refuse a gate before anything is built or run (formats, signatures, labels)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


from tiergate.artifact import Artifact, load_artifact
from tiergate.errors import InputError
from tiergate.evaldata import (EvalData, ReadAhead, check_labels_within, check_sample_count, is_class_indices, is_loader,
                               label_classes,
                               load_eval_data, normalised, validate_against)
from tiergate.dataloader import run_loader
from tiergate.fingerprint import fingerprint
from tiergate.gate import RunOutcome
from tiergate.lint import Finding, lint
from tiergate.orchestrator.types import Intake
from tiergate.policy import Policy
from tiergate.targets import DeviceClass


def intake(path: Path | str, device_classes: Iterable[DeviceClass] = ()) -> Intake:
    """Load, fingerprint and lint an artifact (lint once per runtime among the device classes)."""
    artifact = load_artifact(path)
    findings: dict[tuple, Finding] = {}
    runtimes = {dc.runtime: dc for dc in device_classes} or {None: None}
    for dc in runtimes.values():
        for finding in lint(artifact, dc):
            findings.setdefault((finding.rule, finding.message, tuple(finding.nodes)), finding)
    return Intake(artifact, fingerprint(artifact), list(findings.values()))


def check_formats(intakes: dict[str, Intake], device_classes: list[DeviceClass]) -> None:
    """Every artifact must be in the format of every device class's runtime."""
    for role, item in intakes.items():
        for dc in device_classes:
            if item.artifact.format != dc.artifact_format:
                raise InputError(
                    f"{item.artifact.path}: the {role} is {item.artifact.format}, but device class "
                    f"{dc.name} runs {dc.runtime} ({dc.artifact_format} artifacts)")


def load_data(source: Path | str, intakes: dict[str, Intake], sample_axes: dict[str, int] | None = None,
              policy: Policy | None = None, device_classes: Iterable[DeviceClass] = (),
              ahead: ReadAhead | None = None) -> EvalData:
    """The evaluation data, fitted to the reference's inputs (the first artifact's when there is none); `ahead`:
    the archive read while the models were taken in (evaldata.ReadAhead).

    `source` is an .npz, or a loader FILE.py:FUNCTION run once here and materialised into a
    content-hashed archive. An archive whose sample axes are not all leading is rewritten
    (content-hashed) with its axes inside, for the harness.
    """
    item = intakes.get("reference") or next(iter(intakes.values()))
    inputs = item.artifact.inputs
    if is_loader(source):
        data = run_loader(str(source), inputs, sample_axes)
    else:
        data = load_eval_data(source, inputs, sample_axes, ahead=ahead)
    validate_against(data, inputs)
    if policy is not None:     # a gate on fewer samples than its statistics resolve would promote on no evidence
        needed = max([policy.for_target(dc).min_samples for dc in device_classes] or [policy.defaults.min_samples])
        check_sample_count(data, needed, "fewer samples cannot resolve the policy's "
                                         "confidence bounds; a gate on them would promote on no evidence")
    return normalised(data)


def signature_differences(intakes: dict[str, Intake]) -> list[tuple[str, str]]:
    """(role, difference) for every input or output of the candidate (and incumbent) that differs
    from the reference's by name, dtype or shape (symbolic dimensions match anything)."""
    ref = intakes.get("reference")
    if ref is None:
        return []
    found = []
    for role in ("candidate", "incumbent"):
        if role not in intakes:
            continue
        for kind in ("inputs", "outputs"):
            theirs = {t.name: t for t in getattr(intakes[role].artifact, kind)}
            ours = {t.name: t for t in getattr(ref.artifact, kind)}
            what = kind[:-1]
            for name, spec in ours.items():
                other = theirs.get(name)
                if other is None:
                    found.append((role, f"{what} '{name}' {_spec_text(spec)} of the reference is missing"))
                elif other.dtype != spec.dtype:
                    found.append((role, f"{what} '{name}' is {other.dtype}, the reference's is {spec.dtype}"))
                elif not _shapes_agree(other.shape, spec.shape):
                    found.append((role, f"{what} '{name}' has shape {_spec_text(other)}, the reference's "
                                        f"{_spec_text(spec)}"))
            for name, other in theirs.items():
                if name not in ours:
                    found.append((role, f"{what} '{name}' {_spec_text(other)} is not in the reference"))
    return found


def _shapes_agree(a, b) -> bool:
    fixed = lambda d: isinstance(d, int) and d > 0   # noqa: E731
    return len(a) == len(b) and all(x == y or not fixed(x) or not fixed(y) for x, y in zip(a, b))


def _spec_text(spec) -> str:
    dims = ", ".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in spec.shape)
    return f"{spec.dtype}[{dims}]"


def labels_checked(data: EvalData, intakes: dict[str, Intake]) -> bool:
    """Check the labels against the reference's class count when its output shape says it (True when done)."""
    if not is_class_indices(data.labels):
        return True          # no class indices: nothing to check
    found = label_classes(intakes["reference"].artifact.outputs)
    if found is None:
        return False
    check_labels_within(data, *found)
    return True


def check_labels_after(data: EvalData, reference_folder: Path) -> None:
    """The labels against the class count of the reference's saved outputs (a model with dynamic shapes)."""
    from tiergate.metrics.accuracy import is_classifier

    outcome = RunOutcome.load(reference_folder)
    for name, output in (outcome.outputs or {}).items():
        if is_classifier(output):
            check_labels_within(data, name, output.size // len(output))
            return


def carried_outputs(artifact: Artifact) -> frozenset[str]:
    """Outputs that carry an input's state to the next call (silero's state -> stateN, state_in -> state_out),
    never class scores: named after the input (a common prefix of 4+ characters), same dtype and rank, and no
    fixed dimension that differs."""
    def carries(o, i) -> bool:
        return (len(os.path.commonprefix([o.name, i.name])) >= 4 and o.dtype == i.dtype
                and len(o.shape) == len(i.shape) > 1 and _shapes_agree(o.shape, i.shape))

    return frozenset(o.name for o in artifact.outputs if any(carries(o, i) for i in artifact.inputs))
