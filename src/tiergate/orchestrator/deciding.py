"""Deciding from saved run folders: pure computation, cached as JSON naming every hash it was made from.

`decide_saved(folders, basis)` loads the outcomes, names every input of the decision by hash
(`decision_inputs`: artifacts, data, runs, images, classes, policy, metrics, the deciding code) and answers
from the decision cache (state.read_decision) when all of them match, else decides (`decide`) and saves it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tiergate import state
from tiergate.decision import Decision, GateRun
from tiergate.gate import evaluate
from tiergate.gate.tasks import PAIRED_METRICS
from tiergate.orchestrator.intake import carried_outputs
from tiergate.orchestrator.running import load_outcomes
from tiergate.orchestrator.types import Basis

_DECIDING_MODULES = ("gate", "stats.py", "policy.py", "codec.py", "metrics", "evaldata.py", "outputs", "labels.py")


def resolve_metrics(names: list[str] | None, policy):
    """The task metrics to compute: the policy's [metrics.NAME] tables and --metric names (built-in or
    FILE.py:FUNCTION, imported here once)."""
    from tiergate.metrics.task import resolve

    return resolve(names or [], policy)


def output_kinds(artifact, policy) -> dict:
    """Each output's kind (tiergate.outputs): detected on the reference, the policy's [outputs.NAME] on top."""
    from tiergate.outputs import resolve

    return resolve(artifact, getattr(policy, "outputs", {}) or {})


NO_BOOTSTRAP_KINDS = ("class_scores",)     # outputs judged by top-1's paired intervals and drift figures alone


def bootstraps(basis) -> bool:
    """Whether the decision may bootstrap an interval (scipy.stats): a task metric's (the policy's or --metric's
    other than gate.tasks.PAIRED_METRICS, or an output kind's other than class scores), or an incumbent's mean
    latency."""
    return any(spec.kind not in PAIRED_METRICS for spec in basis.metrics) or "incumbent" in basis.intakes or \
        any(kind.kind not in NO_BOOTSTRAP_KINDS for kind in basis.kinds.values())


def decide_saved(folders: dict[tuple[str, str], Path], basis: Basis, *, hits: int = 0, started: int = 0,
                 extra_inputs: dict | None = None) -> GateRun:
    """The decision from saved run folders: from the decision cache when every input it names matches.
    `extra_inputs`: more that the decision's identity includes (an early decision's look)."""
    outcomes = load_outcomes(folders)
    inputs = decision_inputs(folders, basis) | (extra_inputs or {})
    key = state.decision_key_of(inputs)
    decision = cached_decision(key, inputs)
    cached = decision is not None
    if decision is None:
        decision = decide(outcomes, basis)
        state.save_decision(key, inputs, decision.to_json())
    return GateRun(decision, folders, basis.intakes, outcomes, hits, started, decision_cached=cached,
                   decision_key=key)


def cached_decision(key: str, inputs: dict) -> Decision | None:
    """The saved decision for exactly these inputs; a file that does not verify is discarded with a warning."""
    doc = state.read_decision(key, inputs, discard=True)
    if doc is None:
        return None
    try:
        return Decision.from_json(doc)
    except Exception:  # noqa: BLE001 - an unreadable cache entry is decided again
        state.discard_decision(key)
        return None


def decide(outcomes: dict, basis: Basis) -> Decision:
    """The gate decision from saved outcomes (pure computation)."""
    intakes = basis.intakes
    decision = evaluate(outcomes["candidate"], outcomes["reference"], {dc.name: dc for dc in basis.device_classes},
                        basis.policy, basis.data.labels, outcomes.get("incumbent"),
                        quantized=intakes["candidate"].artifact.is_quantized, metrics=basis.metrics,
                        carried=carried_outputs(intakes["reference"].artifact), kinds=basis.kinds)
    for name, outcome in sorted(outcomes["candidate"].items()):
        off = outcome.result.extra.get("disabled_passes") if outcome.result.ok else None
        if off:
            decision.notes.append(f"{name}: the candidate ran with these optimizer passes off: {', '.join(off)} "
                                  "(the reference and the incumbent as the tier runs them)")
    return decision


def decision_inputs(folders: dict[tuple[str, str], Path], basis: Basis) -> dict:
    """Everything a decision depends on, by hash: artifacts, data, runs, images, classes, policy, code."""
    runs, images = named_runs(folders)
    return basis_inputs(basis) | {"runs": runs, "images": images}


def basis_inputs(basis: Basis) -> dict:
    """What every decision of a gate names besides its runs: the artifacts, the data, the classes, the policy, the
    metrics (user metrics by their code) and the deciding code (the fast path checks them against its request)."""
    intakes = basis.intakes
    return {
        "candidate": intakes["candidate"].sha256,
        "reference": intakes["reference"].sha256,
        "incumbent": intakes["incumbent"].sha256 if "incumbent" in intakes else None,
        "quantized": intakes["candidate"].artifact.is_quantized,
        "data": basis.data.sha256,
        "device_classes": state.classes_identity(basis.device_classes),
        "policy": state.policy_identity(basis.policy),
        "metrics": [m.identity for m in basis.metrics or ()],
        "code": deciding_code_hash(),
    }


def named_runs(folders: dict[tuple[str, str], Path]) -> tuple[dict, dict]:
    """({"role/where": "FOLDER:sha256 of its result.json"}, {"role/where": image id}) in a stable order."""
    runs, images = {}, {}
    for (role, where), folder in sorted(folders.items()):
        runs[f"{role}/{where}"], images[f"{role}/{where}"] = state.run_label_hash(folder)
    return runs, images


def deciding_code_hash() -> str:
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in _DECIDING_MODULES:
        for path in sorted((package / name).rglob("*.py")) if (package / name).is_dir() else [package / name]:
            digest.update(path.read_bytes())
    return digest.hexdigest()
