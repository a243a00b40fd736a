"""The orchestrator's own types: what intake learned, what runs where, where a run's folder is, and what a
decision is made from besides its runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
    pair_with: Intake | None = None  # the candidate's calls are interleaved with this artifact's (the FP32
                                     # reference's) after its run: extra.paired (native classes, latency_pairs)

    @property
    def pairs(self) -> int:
        """Pairs of interleaved calls this run makes (0: none): the class's latency_pairs on a native class, with
        another artifact than its own (the same file against itself is one run, its ratio 1 by construction)."""
        dc = self.device_class
        if self.pair_with is None or dc.emulated or self.pair_with.sha256 == self.intake.sha256:
            return 0
        return dc.evaluation.latency_pairs


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


def say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)
