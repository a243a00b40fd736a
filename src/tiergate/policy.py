"""The gate policy: thresholds from a TOML file, with defaults and per-tier overrides.

Shape of a policy file (see docs/policy.md and data/default-policy.toml):

    [defaults]            # any Thresholds field; replaces the built-in default
    min_cosine = 0.998
    [override.cortex-a]   # a tier name or a device-class name
    max_latency_p99_ms = 40

    [metrics.top5_accuracy]   # a task metric (tiergate.metrics.task) and its ratio to FP32
    min_ratio = 0.99          # (or max_drop = D: a difference, for a metric that can be zero or negative)

A threshold set to `false` is switched off. Unknown tables or keys are errors
naming the file and the key.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Iterable

import tomllib

from tiergate.errors import InputError
from tiergate.figures import AUTO_SPENDING, SPENDING
from tiergate.outputs.kind import parse_table
from tiergate.targets import DeviceClass

DEFAULT_POLICY = "default-policy.toml"
_TABLES = ("defaults", "override", "metrics", "outputs")
ON_INCONCLUSIVE = ("inconclusive", "reject", "promote")
AGREEMENT = ("auto", "gate", "evidence")
_CHOICES = {"on_inconclusive": ON_INCONCLUSIVE, "agreement": AGREEMENT}
# Early decision (docs/policy.md): not thresholds, so they are kept apart from Thresholds (and the decision's
# thresholds JSON); [defaults] and [override.NAME] take them like any other key.
EARLY_KEYS = ("early_stop", "early_looks", "early_spending", "early_seed")
MAX_EARLY_LOOKS = 20


@dataclass(frozen=True)
class EarlyStop:
    """Sequential evaluation of one device class: `looks` looks at growing sample prefixes, alpha spent by
    `spending`; a tier stops at the first look whose verdict is settled. `enabled` None (no early_stop key): on
    for emulated classes, where every sample costs seconds, off elsewhere (Policy.early_stop_for resolves it)."""

    enabled: bool | None = None
    looks: int = 2
    spending: str = AUTO_SPENDING       # resolved per class and sample count (orchestrator.early_settings)
    seed: int = 0                       # the looks' seeded random partition of the samples (orchestrator/early.py)


@dataclass(frozen=True)
class Thresholds:
    """Every limit the gate applies to one device class; None means the check is off."""

    min_accuracy_ratio: float | None = None
    min_cosine: float | None = None
    min_sqnr_db: float | None = None
    min_top1_agreement: float | None = None
    max_relative_l2: float | None = None
    max_abs_error: float | None = None
    max_kl_divergence: float | None = None
    max_latency_p50_ms: float | None = None
    max_latency_p90_ms: float | None = None
    max_latency_p99_ms: float | None = None
    max_latency_ratio: float | None = None
    max_latency_cov: float | None = None
    p99_min_samples: int = 299
    max_cost_per_1k: float | None = None
    # device figures (harness, every run): absolute limits, and ratios against the FP32 reference and the
    # incumbent on the same device class; time and memory are not gated on emulated classes
    max_peak_memory_mb: float | None = None
    max_load_ms: float | None = None
    max_first_inference_ms: float | None = None
    max_artifact_mb: float | None = None
    max_peak_memory_ratio: float | None = None
    max_load_ratio: float | None = None
    max_first_inference_ratio: float | None = None
    max_artifact_ratio: float | None = None
    max_peak_memory_ratio_vs_incumbent: float | None = None
    max_load_ratio_vs_incumbent: float | None = None
    max_first_inference_ratio_vs_incumbent: float | None = None
    max_artifact_ratio_vs_incumbent: float | None = None
    # guest instructions per inference, counted under the counting QEMU: gated on emulated classes only (exact,
    # independent of the host's load); native classes are not counted
    max_instructions_per_inference: float | None = None
    max_instructions_ratio: float | None = None
    max_instructions_ratio_vs_incumbent: float | None = None
    # NPU tiers (Ethos-U, docs/npu.md): Vela's placement of the source model's operators, its estimated time (the NPU's
    # part) and memory; applied on ethos-u classes only
    min_npu_op_share: float | None = None          # operators on the NPU / all (the float interface not counted)
    max_cpu_ops: int | None = None                 # operators that fall back to the CPU, beyond allowed_cpu_ops
    allowed_cpu_ops: tuple[str, ...] = ()          # operator types (SOFTMAX, ...) max_cpu_ops does not count
    max_estimated_time_ratio: float | None = None              # candidate / FP32 reference, Vela's estimate
    max_estimated_time_ratio_vs_incumbent: float | None = None  # candidate / incumbent, Vela's estimate
    max_npu_sram_kib: float | None = None          # SRAM Vela allocates (KiB)
    max_npu_flash_kib: float | None = None         # flash Vela places the weights and constants in (KiB)
    noninferiority_margin: float = 0.01
    max_latency_regression: float = 0.10
    confidence: float = 0.95
    bootstrap_resamples: int = 9999
    # a user metric that returns one number for the whole set is called once per bootstrap resample: as many as
    # this many seconds pay for (never fewer than the confidence needs: else its check is inconclusive, saying so)
    user_metric_budget_s: float = 120.0
    on_inconclusive: str = "inconclusive"   # verdict when a task-metric interval straddles its threshold
    agreement: str = "auto"                 # output agreement (cosine, SQNR, ...): auto = a gate without
                                            # labels, evidence (warnings) when task metrics decide

    @property
    def asks_instructions(self) -> bool:
        """Whether these limits judge instructions per inference: then an emulated class's runs are counted (the
        counting QEMU; otherwise only with --profile)."""
        return any(v is not None for v in (self.max_instructions_per_inference, self.max_instructions_ratio,
                                           self.max_instructions_ratio_vs_incumbent))

    @property
    def min_samples(self) -> int:
        """The fewest evaluation samples these statistics can decide on.

        A one-sided bound at `confidence` cannot be resolved from fewer than
        1 / (1 - confidence) samples (20 at 0.95): below that, the sample's own
        extreme is inside the interval, and a gate would PROMOTE on no evidence.
        """
        return max(2, math.ceil(1 / (1 - self.confidence) - 1e-9))


_INT_KEYS = {"p99_min_samples", "bootstrap_resamples", "max_cpu_ops"}
_LIST_KEYS = {"allowed_cpu_ops"}          # lists of names (operator types), upper-cased
# Bounds of every key (inclusive); a value outside them is refused naming the file and the key.
MAX_BOOTSTRAP_RESAMPLES = 1_000_000
_BOUNDS: dict[str, tuple[float, float]] = {
    "min_accuracy_ratio": (0.0, 1.0), "min_cosine": (-1.0, 1.0), "min_top1_agreement": (0.0, 1.0),
    "min_npu_op_share": (0.0, 1.0), "max_cpu_ops": (0, 1_000_000),
    "noninferiority_margin": (0.0, 1.0), "p99_min_samples": (1, 10_000_000),
    "bootstrap_resamples": (99, MAX_BOOTSTRAP_RESAMPLES), "user_metric_budget_s": (1.0, 86_400.0),
}
_REQUIRED = {"p99_min_samples", "noninferiority_margin", "max_latency_regression",
             "confidence", "bootstrap_resamples", "user_metric_budget_s", "on_inconclusive", "agreement"}   # cannot be switched off
_KNOWN = tuple(f.name for f in fields(Thresholds))


@dataclass(frozen=True)
class Policy:
    defaults: Thresholds
    overrides: dict[str, dict[str, float | int | str | None]]
    sources: tuple[str, ...] = ()
    metrics: dict[str, dict] = field(default_factory=dict)     # [metrics.NAME] tables
    outputs: dict[str, dict] = field(default_factory=dict)     # [outputs.NAME] tables: what each output is
    early: dict[str, dict] = field(default_factory=dict)       # early_* keys: "defaults" and "override.NAME"

    def for_target(self, device_class: DeviceClass) -> Thresholds:
        """Defaults, then the tier's override, then the device class's own override."""
        merged = self.defaults
        for key in (device_class.tier, device_class.name):
            if key in self.overrides:
                merged = replace(merged, **self.overrides[key])
        return merged

    def early_stop_for(self, device_class: DeviceClass) -> EarlyStop:
        """The early-decision settings of one device class: defaults, then its tier's, then its own."""
        merged = EarlyStop(**self.early.get("defaults", {}))
        for key in (device_class.tier, device_class.name):
            merged = replace(merged, **self.early.get(f"override.{key}", {}))
        if merged.enabled is None:
            merged = replace(merged, enabled=device_class.emulated)
        return merged

    def check_override_names(self, device_classes: Iterable[DeviceClass]) -> None:
        """An override naming no known tier or device class is a typo: refuse it."""
        classes = list(device_classes)
        known = {dc.tier for dc in classes} | {dc.name for dc in classes}
        unknown = sorted(set(self.overrides) - known)
        if unknown:
            raise InputError(
                f"policy {self.sources[-1] if self.sources else ''}: [override.{unknown[0]}] names no "
                f"known tier or device class (known: {', '.join(sorted(known))})"
            )

    def to_json(self) -> dict:
        doc = {"sources": list(self.sources), "defaults": asdict(self.defaults),
               "overrides": self.overrides, "metrics": self.metrics}
        if self.outputs:
            doc["outputs"] = self.outputs
        if self.early:
            doc["early"] = self.early
        return doc


def load_policy(path: str | Path | None = None) -> Policy:
    """The built-in defaults, with the user's policy file (if any) on top."""
    default_text = resources.files("tiergate").joinpath("data", DEFAULT_POLICY).read_text("utf-8")
    base = _parse(DEFAULT_POLICY, default_text)
    if path is None:
        return _build(base, {}, (f"builtin:{DEFAULT_POLICY}",))
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise InputError(f"policy {path}: file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"policy {path}: cannot be read ({exc})") from None
    user = _parse(str(path), text)
    merged_defaults = {**base["defaults"], **user["defaults"]}
    early = {**base["early"], **user["early"]}
    if "defaults" in base["early"] or "defaults" in user["early"]:
        early["defaults"] = {**base["early"].get("defaults", {}), **user["early"].get("defaults", {})}
    return _build({"defaults": merged_defaults, "metrics": {**base["metrics"], **user["metrics"]}, "early": early,
                   "outputs": {**base["outputs"], **user["outputs"]}},
                  user["override"], (f"builtin:{DEFAULT_POLICY}", str(path)))


def _build(base: dict, overrides: dict, sources: tuple[str, ...]) -> Policy:
    return Policy(defaults=Thresholds(**base["defaults"]), overrides=overrides, sources=sources,
                  metrics=base.get("metrics", {}), early=base.get("early", {}), outputs=base.get("outputs", {}))


def _parse(name: str, text: str) -> dict:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"policy {name}: not valid TOML: {exc}") from None
    for key in data:
        if key not in _TABLES:
            raise InputError(f"policy {name}: unknown key '{key}' (known tables: [defaults], [override.NAME], "
                             "[metrics.NAME], [outputs.NAME])")
    early: dict[str, dict] = {}
    defaults = _section(name, "defaults", data.get("defaults", {}), early)
    overrides = data.get("override", {})
    if not isinstance(overrides, dict):
        raise InputError(f"policy {name}: 'override' must be tables [override.NAME]")
    metrics = data.get("metrics", {})
    if not isinstance(metrics, dict):
        raise InputError(f"policy {name}: 'metrics' must be tables [metrics.NAME]")
    outputs = data.get("outputs", {})
    if not isinstance(outputs, dict):
        raise InputError(f"policy {name}: 'outputs' must be tables [outputs.NAME] (NAME: a model output)")
    return {"defaults": defaults,
            "override": {target: _section(name, f"override.{target}", table, early)
                         for target, table in overrides.items()},
            "metrics": {metric: _metric_table(name, metric, table) for metric, table in metrics.items()},
            "outputs": {output: parse_table(f"policy {name}: [outputs.{output}]", table)
                        for output, table in outputs.items()},
            "early": early}


_METRIC_KEYS = {"min_ratio": float, "max_ratio": float, "max_drop": float, "threshold": float, "k": int,
                "positive": int, "output": str}


def _metric_table(name: str, metric: str, table) -> dict:
    where = f"policy {name}: [metrics.{metric}]"
    if not isinstance(table, dict):
        raise InputError(f"{where} must be a table")
    out = {}
    for key, value in table.items():
        kind = _METRIC_KEYS.get(key)
        if kind is None:
            raise InputError(f"{where}: unknown key '{key}' (known: {', '.join(_METRIC_KEYS)})")
        if kind is str:
            if not isinstance(value, str):
                raise InputError(f"{where} {key} must be a string, got {value!r}")
        elif value is False and key in ("min_ratio", "max_ratio", "max_drop"):
            out[key] = False          # switched off: reported only (metrics.task.builtin)
            continue
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0 or (kind is int and not isinstance(value, int)):
            raise InputError(f"{where} {key} must be a non-negative {'whole ' if kind is int else ''}number, "
                             f"got {value!r}")
        out[key] = value if kind is not float or value is None else float(value)
    return out


def _section(name: str, where: str, table, early: dict[str, dict]) -> dict:
    """A table's thresholds; its early_* keys go to `early[where]`."""
    if not isinstance(table, dict):
        raise InputError(f"policy {name}: '{where}' must be a table")
    found = dict(_early_value(name, where, key, value) for key, value in table.items() if key in EARLY_KEYS)
    if found:
        early[where] = found
    return {key: _value(name, where, key, value) for key, value in table.items() if key not in EARLY_KEYS}


def _early_value(name: str, where: str, key: str, value):
    bad = f"policy {name}: [{where}] {key}"
    if key == "early_stop":
        if not isinstance(value, bool):
            raise InputError(f"{bad} must be true or false, got {value!r}")
        return "enabled", value
    if key == "early_spending":
        if value not in (AUTO_SPENDING, *SPENDING):
            raise InputError(f"{bad} must be one of {', '.join(repr(c) for c in (AUTO_SPENDING, *SPENDING))}, "
                             f"got {value!r}")
        return "spending", value
    if key == "early_seed":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 63:
            raise InputError(f"{bad} must be a whole number from 0 to 2**63 - 1, got {value!r}")
        return "seed", value
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_EARLY_LOOKS:
        raise InputError(f"{bad} must be a whole number from 2 to {MAX_EARLY_LOOKS}, got {value!r}")
    return "looks", value


def _value(name: str, where: str, key: str, value):
    if key not in _KNOWN:
        raise InputError(f"policy {name}: unknown key '{key}' in [{where}] (known: {', '.join(_KNOWN + EARLY_KEYS)})")
    bad = f"policy {name}: [{where}] {key}"
    if key in _LIST_KEYS:
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise InputError(f"{bad} must be a list of operator names (e.g. [\"SOFTMAX\"]), got {value!r}")
        return tuple(v.strip().upper() for v in value)
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            raise InputError(f"{bad} must be one of {', '.join(repr(c) for c in _CHOICES[key])}, got {value!r}")
        return value
    if value is False:
        if key in _REQUIRED:
            raise InputError(f"{bad} cannot be switched off")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{bad} must be a number (or false to switch it off), got {value!r}")
    if not math.isfinite(value):
        raise InputError(f"{bad} must be a finite number, got {value!r}")
    if key in _INT_KEYS and (not isinstance(value, int) or value < (0 if key == "max_cpu_ops" else 1)):
        raise InputError(f"{bad} must be a whole number of at least {0 if key == 'max_cpu_ops' else 1}, got {value!r}")
    if value < 0:
        raise InputError(f"{bad} must not be negative, got {value!r}")
    if key == "confidence" and not 0 < value < 1:
        raise InputError(f"{bad} must be between 0 and 1, got {value!r}")
    low, high = _BOUNDS.get(key, (0, math.inf))
    if not low <= value <= high:
        raise InputError(f"{bad} must be between {low:g} and {high:g}, got {value!r}")
    return int(value) if key in _INT_KEYS else float(value)
