"""The orchestrator's own types: what intake learned, what runs where, where a run's folder is, and what a
decision is made from besides its runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tiergate.artifact import Artifact
from tiergate.evaldata import EvalData
from tiergate.fingerprint import Fingerprint
from tiergate.images import BuiltImage
from tiergate.lint import Finding
from tiergate.policy import Policy
from tiergate.targets import DeviceClass

Progress = Callable[[str], None]


@dataclass
class Intake:
    """What intake learned about one artifact."""

    artifact: Artifact
    fingerprint: Fingerprint
    findings: list[Finding]
    # one call's shape per input from the evaluation data (EvalData.call_shapes: the sample axis None), handed to
    # the builder of a class that compiles the artifact at static shapes (building.build_images); else None
    input_shapes: dict | None = None

    @property
    def sha256(self) -> str:
        return self.artifact.sha256


@dataclass
class RunSpec:
    """One artifact (by role) on one device class."""

    role: str
    device_class: DeviceClass
    intake: Intake
    image: BuiltImage | None = None
    build_error: str | None = None
    profile: bool = False            # per-op time in the run's device figures (harness --profile)
    count: bool = False              # instructions counted on an emulated class (the counting QEMU): asked for
    pair_with: tuple[Intake, ...] = ()   # the candidate's calls are interleaved with these artifacts' (the FP32
                                         # reference's, the incumbent's) after its run: extra.paired (native)

    @property
    def partners(self) -> tuple[Intake, ...]:
        """The artifacts this run's calls are interleaved with: pair_with on a native class whose latency_pairs is
        set, each once and never its own file (the same file against itself is one run, its ratio 1); none where the
        class compiles its artifacts (each library is in its own image)."""
        dc = self.device_class
        if dc.emulated or dc.evaluation.latency_pairs <= 0 or dc.compiled:
            return ()
        seen, out = {self.intake.sha256}, []
        for item in self.pair_with:
            if item.sha256 not in seen:
                seen.add(item.sha256)
                out.append(item)
        return tuple(out)

    @property
    def pairs(self) -> int:
        """Rounds of interleaved calls this run makes (0: none)."""
        return self.device_class.evaluation.latency_pairs if self.partners else 0


@dataclass
class RunDone:
    """Where one run's result folder is, and whether it was reused or started."""

    role: str
    device_class: str
    folder: Path
    cached: bool
    started: bool


@dataclass(frozen=True)
class Basis:
    """What a decision is made from besides its runs: the artifacts' intakes, the classes, the policy, the
    samples (their labels and identity) and the task metrics."""

    intakes: dict[str, Intake]
    device_classes: tuple[DeviceClass, ...]
    policy: Policy
    data: EvalData
    metrics: tuple = ()
    kinds: dict = field(default_factory=dict)     # output -> tiergate.outputs.OutputKind (the reference's)


def say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


def tell(progress: Progress | None, text: str) -> None:
    """What a user must hear even without a progress line (a long wait's cause): the progress line, else stderr."""
    if progress is not None:
        progress(text)
    else:
        import sys

        print(f"tiergate: {text}", file=sys.stderr, flush=True)
