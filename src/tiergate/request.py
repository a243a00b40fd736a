"""The gate request, defined once (stdlib only): every option's name, type, default and help.

`GATE_OPTIONS` is the one definition of `tiergate gate`'s options. The typer command
(cli/gate.py, through cli/options.py) and the fast parser of an unchanged re-run (`parse`,
used by cli/fastgate.py before typer is imported) are both made from it, so a new option is
one edit here (and its use). Each option belongs to one group:

- "request": what the decision depends on: `GateRequest` (artifacts, data, classes, policy, ...);
- "build": how images are built: `BuildSettings`, held by the builder seam (orchestrator.DockerBuilder);
- "run": how the work is done, never what it decides: `RunOptions` (registry, parallelism, shards);
- "output": what the CLI prints and writes (--json, --junit, --report-dir, --explain, --attest and its
  --signing-key).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiergate.policy import Policy
from tiergate.targets import DeviceClass

REGISTRY_ENV = "TIERGATE_REGISTRY_URL"


@dataclass(frozen=True)
class Option:
    """One command-line option. kind: "path", "text", "int" (a value), "many" (repeatable text),
    "flag" (on when given), "switch" (--X/--no-X: True, False or None when neither is given)."""

    param: str
    flags: tuple[str, ...]
    kind: str
    group: str
    help: str
    default: Any = None
    required: bool = False
    minimum: int | None = None
    envvar: str | None = None

    @property
    def off_flag(self) -> str:
        return "--no-" + self.flags[0][2:]


GATE_OPTIONS: tuple[Option, ...] = (
    Option("candidate", ("--candidate", "-c"), "path", "request",
           "The artifact to gate (ONNX or TFLite): a file, or models:/NAME/VERSION or models:/NAME@ALIAS in MLflow's "
           "model registry (docs/mlflow.md).", required=True),
    Option("reference", ("--reference", "-r"), "path", "request",
           "Its FP32 reference, same format (a file or a models:/ URI).", required=True),
    Option("data", ("--data", "-d"), "text", "request",
           ".npz: one array per model input, optional 'labels'; or a loader FILE.py:FUNCTION "
           "yielding {input: array} or ({input: array}, label) per sample.", required=True),
    Option("sample_axis", ("--sample-axis",), "many", "request",
           "NAME=AXIS: the sample axis of an input (or output) when the model's symbolic dims do not say "
           "(repeatable).", default=()),
    Option("metric", ("--metric",), "many", "request",
           "A task metric: a built-in name (top5_accuracy, f1, roc_auc, mean_iou, mae, ...) or "
           "FILE.py:FUNCTION(outputs, labels) -> float, higher is better, gated by [metrics.NAME] min_ratio "
           "(repeatable).", default=()),
    Option("targets", ("--targets", "-t"), "text", "request", "Device classes, comma-separated.", required=True),
    Option("incumbent", ("--incumbent",), "path", "request",
           "The currently promoted artifact (A/B): a file or a models:/ URI."),
    Option("policy", ("--policy",), "path", "request", "Policy TOML (defaults: docs/policy.md)."),
    Option("junit", ("--junit",), "path", "output", "Write JUnit XML here (one case per check)."),
    Option("report_dir", ("--report-dir",), "path", "output", "Write gate-summary.md and gate-decision.json here."),
    Option("as_json", ("--json",), "flag", "output", "Print the decision as JSON.", default=False),
    Option("registry_url", ("--registry",), "text", "run", "Record runs and the decision in this registry.",
           envvar=REGISTRY_ENV),
    Option("base_image", ("--base-image",), "text", "build", "Base image for runtime images."),
    Option("ca_bundle", ("--ca-bundle",), "path", "build", "Extra CA bundle for builds behind a proxy."),
    Option("max_parallel", ("--max-parallel",), "int", "run", "Containers running at a time.", default=2,
           minimum=1),
    Option("shards", ("--shards",), "int", "run",
           "Split each tier's samples over N containers (merged in sample order; default: the class's "
           "[evaluation] shards, automatic on emulated classes). Never changes the decision.", minimum=1),
    Option("early_stop", ("--early-stop",), "switch", "request",
           "Decide each tier at the first look (a growing share of the samples) whose verdict is settled, alpha "
           "spent across looks (docs/policy.md, early_looks); --no-early-stop: every sample on every tier. Default: "
           "the policy's early_stop, else on for emulated classes and off for the others."),
    Option("profile", ("--profile",), "flag", "request", "Also record per-op time (op type and node) per run.",
           default=False),
    Option("disable_pass", ("--disable-pass",), "many", "request",
           "NAME: run the candidate with this optimizer pass switched off on every tier (repeatable): an "
           "onnxruntime graph transformer (e.g. QDQSelectorActionTransformer), XNNPACK for LiteRT's delegate, or a "
           "TVM pass; the reference and the incumbent run as the tier does (tiergate bisect finds such passes; "
           "docs/bisect.md).", default=()),
    Option("explain", ("--explain",), "flag", "output",
           "On REJECT, name the first divergent layer per tier (tiergate explain; the cached decision is "
           "unchanged).", default=False),
    Option("attest", ("--attest",), "path", "output",
           "Write a signed attestation of the decision here: an in-toto Statement v1 about the candidate in a DSSE "
           "envelope (tiergate verify checks it); needs --signing-key."),
    Option("signing_key", ("--signing-key",), "path", "output",
           "The Ed25519 private key (PEM, tiergate keygen PATH) that signs --attest."),
    Option("mlflow_promote", ("--mlflow-promote",), "text", "output",
           "ALIAS: with an MLflow candidate, move this MLflow alias to the candidate's version on PROMOTE only "
           "(the version is tagged with the verdict in any case; docs/mlflow.md)."),
)


def is_mlflow_uri(value) -> bool:
    """Whether an artifact option names a model in MLflow's registry (models:/...) rather than a file."""
    return value is not None and str(value).startswith("models:")


def is_loader(spec) -> bool:
    """Whether a --data value names a loader (FILE.py:FUNCTION) rather than an .npz file."""
    file, sep, function = str(spec).rpartition(":")
    return bool(sep) and file.endswith(".py") and function.isidentifier()


def source_file(spec) -> Path | None:
    """The file a --data or --metric value reads: a loader's (or metric's) Python file, else the path itself."""
    if spec is None:
        return None
    return Path(str(spec).rpartition(":")[0]) if is_loader(spec) else Path(spec)


def option(param: str) -> Option:
    """The option of a parameter (other commands share some: `tiergate demo --max-parallel`)."""
    return next(o for o in GATE_OPTIONS if o.param == param)


def defaults() -> dict[str, Any]:
    return {o.param: (list(o.default) if o.kind == "many" else o.default) for o in GATE_OPTIONS}


# --- the fast parser ----------------------------------------------------------------------------------


def _by_flag() -> dict[str, tuple[Option, bool]]:
    table: dict[str, tuple[Option, bool]] = {}
    for o in GATE_OPTIONS:
        for flag in o.flags:
            table[flag] = (o, True)
        if o.kind == "switch":
            table[o.off_flag] = (o, False)
    return table


def parse(args: list[str]) -> dict | None:
    """The options as the gate command's parameters (typed, defaults filled), or None when this parser is not
    sure (an unknown option, --help, a value given twice or not valid): the typer command then answers."""
    table, found, seen = _by_flag(), defaults(), set()
    i = 0
    while i < len(args):
        token = args[i]
        name, eq, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        if name not in table:
            return None
        opt, on = table[name]
        if opt.kind in ("flag", "switch"):
            if eq or opt.param in seen:
                return None
            found[opt.param], i = on, i + 1
        else:
            if eq:
                value, i = inline, i + 1
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                value, i = args[i + 1], i + 2
            else:
                return None
            if opt.kind == "many":
                found[opt.param].append(value)
            elif opt.param in seen:
                return None
            else:
                found[opt.param] = _typed(opt, value)
                if found[opt.param] is None:
                    return None
        seen.add(opt.param)
    if any(o.required and o.param not in seen for o in GATE_OPTIONS):
        return None
    return found


def _typed(opt: Option, value: str):
    if opt.kind == "path":
        return Path(value)
    if opt.kind == "int":
        try:
            number = int(value)
        except ValueError:
            return None
        return number if opt.minimum is None or number >= opt.minimum else None
    return value


# --- what the options make ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRequest:
    """What a gate is asked, as far as its decision depends on it (the "request" options, loaded)."""

    candidate: Path
    reference: Path
    data: str
    device_classes: tuple[DeviceClass, ...]
    policy: Policy
    incumbent: Path | None = None
    metrics: tuple[str, ...] = ()            # --metric, as given
    sample_axes: tuple[str, ...] = ()        # --sample-axis NAME=AXIS, as given
    profile: bool = False
    early_stop: bool | None = None           # --early-stop / --no-early-stop (None: the policy's)
    disabled_passes: tuple[str, ...] = ()    # --disable-pass: the candidate's runs only (candidate_class)

    @property
    def artifacts(self) -> dict[str, Path]:
        paths = {"candidate": self.candidate, "reference": self.reference, "incumbent": self.incumbent}
        return {role: Path(p) for role, p in paths.items() if p is not None}


@dataclass(frozen=True)
class BuildSettings:
    """How runtime images are built (the "build" options): held by the builder seam only."""

    base_image: str | None = None
    ca_bundle: Path | None = None


@dataclass
class RunOptions:
    """How a gate does its work, never what it decides (the "run" options, and where its state goes)."""

    registry: Any = None                     # a tiergate.registry.Registry to reuse and record runs in
    records: bool = False                    # the decision will be recorded in `registry`: the candidate must be
                                             # registered there (checked before anything is built or run)
    max_parallel: int = 2
    shards: int | None = None
    progress: Callable[[str], None] | None = None
    root: Path | None = None                 # the runs folder (default: TIERGATE_HOME/runs)


def request_fields(values: dict, device_classes, policy: Policy) -> GateRequest:
    """The GateRequest of parsed option values (device classes and policy already loaded)."""
    return GateRequest(Path(values["candidate"]), Path(values["reference"]), str(values["data"]),
                       tuple(device_classes), policy, incumbent=values.get("incumbent"),
                       metrics=tuple(values.get("metric") or ()), sample_axes=tuple(values.get("sample_axis") or ()),
                       profile=bool(values.get("profile")), early_stop=values.get("early_stop"),
                       disabled_passes=disabled_passes(values.get("disable_pass") or ()))


def disabled_passes(names) -> tuple[str, ...]:
    """--disable-pass values: stripped, each once, in a stable (sorted) order; an empty name is an error."""
    from tiergate.errors import InputError

    out = set()
    for name in names:
        if not str(name).strip():
            raise InputError("--disable-pass: give a pass name (e.g. QDQSelectorActionTransformer)")
        out.add(str(name).strip())
    return tuple(sorted(out))


def candidate_class(dc: DeviceClass, request: GateRequest) -> DeviceClass:
    """The device class the candidate runs on: the tier's, with the request's --disable-pass passes off as well
    (the reference and the incumbent run on the tier's own)."""
    if not request.disabled_passes:
        return dc
    return dataclasses.replace(dc, disabled_passes=tuple(sorted({*dc.disabled_passes, *request.disabled_passes})))


def build_settings(values: dict) -> BuildSettings:
    return BuildSettings(values.get("base_image"), values.get("ca_bundle"))
