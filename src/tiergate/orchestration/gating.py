"""One gate inside a Prefect flow: intake → build → run (in parallel) → compare → gate → record → report.

The steps are the pipeline's (tiergate.pipeline); here they become Prefect tasks,
runs of device classes mapped to a work pool go to a worker there (remote.py),
and the decision shows in the Prefect UI as a Markdown and a table artifact.

An unchanged input reuses what was recorded: each run whose artifact, device
class, image id and data hash are unchanged is taken from its saved result
(no container starts), and when every run was reused and the decision comes out
identical to the last one recorded for the artifact, that decision is reused
instead of recording a duplicate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.futures import wait

from tiergate import pipeline
from tiergate.orchestration.tasks import RunDone, build_task, intake_task, run_task
from tiergate.policy import Policy
from tiergate.targets import DeviceClass


@dataclass
class Remote:
    """Where runs of some device classes go: a work pool per class, and what a worker there needs."""

    pools: dict[str, str] = field(default_factory=dict)   # device class -> work pool
    shas: dict[str, str] = field(default_factory=dict)    # role -> registered artifact sha256
    data: str = ""
    registry_url: str | None = None
    store: str | None = None


def gate_in_flow(paths: dict[str, Path], data_path: Path, device_classes: list[DeviceClass], policy: Policy, *,
                 registry=None, root: Path | None = None, base_image: str | None = None,
                 ca_bundle: Path | None = None, remote: Remote | None = None) -> pipeline.GateRun:
    """The gate's steps as tasks; raises the first task failure (e.g. an InfrastructureFault) after all ended."""
    futures = {role: intake_task.submit(role, path, device_classes) for role, path in paths.items()}
    intakes = {role: future.result() for role, future in futures.items()}
    pipeline.check_formats(intakes, device_classes)
    data = pipeline.load_data(data_path, intakes)
    remote = remote or Remote()
    local = [dc for dc in device_classes if dc.name not in remote.pools]
    specs = {dc.name: [pipeline.RunSpec(role, dc, item) for role, item in intakes.items()] for dc in local}
    built = _results([build_task.submit(dc, specs[dc.name], base_image, ca_bundle) for dc in local])
    runs = [run_task.submit(spec, data, root, registry) for class_specs in built for spec in class_specs]
    runs += _remote_runs(remote, intakes, device_classes, root)
    done: list[RunDone] = _results(runs)
    folders = {(d.role, d.device_class): d.folder for d in done}
    ordered = {(role, dc.name): folders[(role, dc.name)] for role in intakes for dc in device_classes}
    outcomes = pipeline.load_outcomes(ordered)
    decision = pipeline.decide(outcomes, intakes, device_classes, policy, data)
    return pipeline.GateRun(decision, intakes, outcomes, ordered, cache_hits=sum(d.cached for d in done),
                            containers_started=sum(d.started for d in done))


def _remote_runs(remote: Remote, intakes: dict, device_classes: list[DeviceClass], root: Path | None) -> list:
    wanted = [dc for dc in device_classes if dc.name in remote.pools]
    if not wanted:
        return []
    from tiergate.orchestration.remote import remote_run_task

    return [remote_run_task.submit(role, dc, remote.pools[dc.name], remote.shas[role], remote.data,
                                   remote.registry_url, remote.store, root)
            for dc in wanted for role in intakes]


def _results(futures: list) -> list:
    """Every future's result once all have ended; the first failure is raised (nothing left running)."""
    wait(futures)
    return [future.result() for future in futures]


# --- conclude: reuse or record, reports, Prefect artifacts ----------------------------------------


@dataclass
class Concluded:
    verdict: str
    decision_id: int | None
    reused_decision: bool
    cache_hits: int
    containers_started: int
    reports: dict[str, str]

    def to_json(self) -> dict:
        return dict(self.__dict__)


def conclude(gate_run: pipeline.GateRun, *, registry=None, report_dir: Path | None = None,
             junit: Path | None = None, label: str = "gate", cost_tags: dict[str, str] | None = None) -> Concluded:
    """Record the decision (or reuse an identical recorded one), write reports, publish Prefect artifacts."""
    decision_id, reused = None, False
    if registry is not None:
        recorded, reused = pipeline.record_or_reuse(registry, gate_run, cost_tags=cost_tags)
        decision_id = recorded.id
    written = pipeline.write_reports(gate_run, report_dir, junit)
    publish(gate_run, label, decision_id, reused)
    return Concluded(gate_run.decision.verdict, decision_id, reused, gate_run.cache_hits,
                     gate_run.containers_started, {k: str(v) for k, v in written.items()})


def publish(gate_run: pipeline.GateRun, label: str, decision_id: int | None, reused: bool) -> None:
    """The decision in the Prefect UI: the Markdown summary and a table of every check."""
    from tiergate.reports.markdown import render_markdown

    decision = gate_run.decision
    key = artifact_key(label)
    footer = (f"\n\nRuns: {gate_run.containers_started} started, {gate_run.cache_hits} reused. "
              f"Registry decision: {decision_id if decision_id is not None else 'not recorded'}"
              f"{' (reused, unchanged input)' if reused else ''}.\n")
    create_markdown_artifact(render_markdown(decision) + footer, key=key,
                             description=f"tiergate decision: {decision.verdict}")
    rows = [{"device class": c.device_class, "tier": c.tier, "check": c.label, "value": _cell(c.value),
             "threshold": "" if c.threshold is None else f"{c.op} {_cell(c.threshold)}",
             "result": "pass" if c.passed else "FAIL"} for c in decision.checks]
    create_table_artifact(rows, key=f"{key}-checks", description=f"tiergate checks: {decision.verdict}")


def artifact_key(label: str) -> str:
    """A Prefect artifact key (lower-case letters, digits and dashes)."""
    return "tiergate-" + (re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "gate")


def _cell(value) -> str | float | None:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value if value is None or isinstance(value, (int, str)) else str(value)
