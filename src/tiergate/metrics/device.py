"""Device figures of a run in the units a policy uses, and their ratios between two runs.

The harness measures them (containers/harness/harness_memory.py and the core loop:
tiergate.results.DeviceFigures); this module only names and compares them. Each
figure has a policy key for its absolute limit (`max_<figure>`), one for its ratio
to the FP32 reference (`max_<base>_ratio`) and one for its ratio to the incumbent
(`max_<base>_ratio_vs_incumbent`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiergate.results import MB, DeviceFigures


@dataclass(frozen=True)
class Figure:
    name: str            # the check's name and the absolute limit's key without "max_": peak_memory_mb
    base: str            # the ratio keys' stem: peak_memory
    unit: str
    emulation_bound: bool   # measured under QEMU it says nothing of a device: not gated on emulated classes
    meaning: str
    counted: bool = False   # counted by the counting QEMU: measured on emulated classes only, never natively

    def value(self, figures: DeviceFigures | None) -> float | None:
        if figures is None:
            return None
        raw = {"peak_memory_mb": figures.peak_memory_bytes, "load_ms": figures.load_ms,
               "first_inference_ms": figures.first_inference_ms, "artifact_mb": figures.artifact_bytes,
               "instructions_per_inference": figures.instructions_per_inference}[self.name]
        if raw is None:
            return None
        return raw / MB if self.unit == "MB" else float(raw)

    @property
    def limit_key(self) -> str:
        return f"max_{self.name}"

    @property
    def ratio_key(self) -> str:
        return f"max_{self.base}_ratio"

    @property
    def incumbent_ratio_key(self) -> str:
        return f"max_{self.base}_ratio_vs_incumbent"


FIGURES = (
    Figure("peak_memory_mb", "peak_memory", "MB", True, "peak resident memory of the process that runs the model"),
    Figure("load_ms", "load", "ms", True, "session / interpreter creation, EP and delegate set-up included"),
    Figure("first_inference_ms", "first_inference", "ms", True, "the cold first inference call"),
    Figure("artifact_mb", "artifact", "MB", False, "size of the artifact (and its external data)"),
    Figure("instructions_per_inference", "instructions", "instructions", False,
           "guest instructions per inference call (median of the timed calls), counted exactly under QEMU", True),
)


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base; None when either is missing or the base is not positive."""
    if value is None or base is None or base <= 0:
        return None
    return value / base


def ratios(candidate: DeviceFigures | None, other: DeviceFigures | None, suffix: str = "") -> dict[str, float]:
    """{"<base>_ratio<suffix>": candidate / other} for every figure both runs have."""
    out = {}
    for fig in FIGURES:
        r = ratio(fig.value(candidate), fig.value(other))
        if r is not None:
            out[f"{fig.base}_ratio{suffix}"] = r
    return out
