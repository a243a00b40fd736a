"""Recording a gate in the registry: the candidate's runs and the decision in one transaction."""

from __future__ import annotations

import json

from tiergate import results
from tiergate.decision import GateRun


def check_registered(registry, candidate) -> None:
    """A gate whose decision is to be recorded needs its candidate (an orchestrator intake) in the registry: said
    before anything is built or run, not after the runs (the decision's row names the artifact's)."""
    from tiergate.errors import InputError
    from tiergate.registry.masking import masked

    if registry.find_artifact(candidate.sha256) is None:
        path = candidate.artifact.path
        raise InputError(f"the candidate {path.name} ({candidate.sha256[:12]}) is not in the registry "
                         f"{masked(registry.url)}: register it first (tiergate register {path} --model NAME "
                         f"--reference FP32.onnx), or gate without --registry")


def record(registry, gate_run: GateRun, *, cost_tags: dict[str, str] | None = None, reuse_same: bool = False):
    """Record the candidate's runs and the decision in one transaction (moves aliases on PROMOTE)."""
    from tiergate.registry import NewRun, record_gate_decision

    runs = []
    for (role, _dc), folder in gate_run.run_dirs.items():
        if role != "candidate":
            continue
        result = results.load(folder)
        runs.append(NewRun.from_result(result, folder=folder if result.ok else None))
    sha = gate_run.intakes["candidate"].sha256
    detail = gate_run.decision.to_json()
    if gate_run.runtime:
        detail["runtime"] = gate_run.runtime_summary()
    return record_gate_decision(registry, sha, detail, runs=runs, cost_tags=cost_tags, reuse_same=reuse_same)


def reusable_decision(registry, gate_run: GateRun):
    """The last recorded decision of the candidate, when no run was new and it says exactly the same."""
    if gate_run.containers_started or gate_run.cache_hits < len(gate_run.run_dirs):
        return None
    decisions = registry.decisions(artifact_sha=gate_run.intakes["candidate"].sha256)
    if not decisions:
        return None
    recorded = {k: v for k, v in decisions[-1].detail.items() if k != "runtime"}
    return decisions[-1] if recorded == json.loads(gate_run.decision.dumps()) else None


def record_or_reuse(registry, gate_run: GateRun, *, cost_tags: dict[str, str] | None = None):
    """(decision record, reused): an unchanged input reuses its recorded decision, no duplicate row."""
    previous = reusable_decision(registry, gate_run)
    if previous is not None:
        return previous, True
    # checked again inside the write: a concurrent gate of the same input may have just recorded it
    recorded = record(registry, gate_run, cost_tags=cost_tags, reuse_same=True)
    return recorded, recorded.reused
