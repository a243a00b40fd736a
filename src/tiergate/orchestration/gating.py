"""One gate inside a Prefect flow: the orchestrator's own sequence (tiergate.orchestrator.gate), its steps as tasks.

Nothing of the gate is re-implemented here: `PrefectSteps` is the orchestrator's
`Steps` seam, submitting each intake, build and run as a Prefect task (builds and
runs retried on infrastructure faults only), and device classes mapped to a work
pool get a builder and backend that hand their runs to a worker there (remote.py).
So a gate from the CLI and the same gate from a flow share the run cache and the
decision cache, and give the same decision. The decision shows in the Prefect UI
as a Markdown and a table artifact.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait

from tiergate import orchestrator
from tiergate.decision import GateRun
from tiergate.orchestration.tasks import INFRA_RETRIES, INFRA_RETRY_DELAY_S, infrastructure_only
from tiergate.policy import Policy
from tiergate.request import BuildSettings, GateRequest
from tiergate.targets import DeviceClass


class PrefectSteps:
    """The orchestrator's Steps seam as Prefect tasks: one task run per item, named after it."""

    RETRIED = ("build", "run")   # an engine fault there is worth a retry; intake and decide are not

    def map(self, step, fn, items, *, limit=None, name=str) -> list:
        if not items:
            return []
        slots = threading.BoundedSemaphore(limit) if limit else None

        def body(item):
            if slots is None:
                return fn(item)
            with slots:
                return fn(item)

        options = dict(name=step, cache_policy=NO_CACHE)
        if step in self.RETRIED:
            options.update(retries=INFRA_RETRIES, retry_delay_seconds=INFRA_RETRY_DELAY_S,
                           retry_condition_fn=infrastructure_only)
        step_task = task(**options)(body)
        futures = [step_task.with_options(task_run_name=f"{step} {name(item)}").submit(item) for item in items]
        wait(futures)
        return [future.result() for future in futures]


@dataclass
class Remote:
    """Where runs of some device classes go: a work pool per class, and what a worker there needs."""

    pools: dict[str, str] = field(default_factory=dict)   # device class -> work pool
    data: str = ""
    registry_url: str | None = None
    store: str | None = None


def flow_seams(remote: Remote | None = None, build: BuildSettings | None = None, steps=None) -> orchestrator.Seams:
    """Prefect steps (or `steps`); pooled device classes build and run on their work pool's workers (an emulated
    class's samples shared among them: remote.py)."""
    builder = orchestrator.DockerBuilder(build or BuildSettings())
    steps = steps or PrefectSteps()
    if not remote or not remote.pools:
        return orchestrator.Seams(builder=builder, steps=steps)
    import contextvars

    from tiergate.orchestration.remote import PoolBackend, PoolBuilder

    # the caller's Prefect context (its API, settings, flow run): the runs' threads start without one
    context = contextvars.copy_context()

    def backend_for(dc: DeviceClass):
        return PoolBackend(remote.pools[dc.name], remote, context) if dc.name in remote.pools \
            else orchestrator.default_backend_for(dc)

    return orchestrator.Seams(builder=PoolBuilder(builder, remote.pools), backend_for=backend_for, steps=steps)


def flow_request(paths: dict[str, Path], data: Path | str, device_classes: list[DeviceClass], policy: Policy,
                 sample_axes: dict[str, int] | None = None, metrics: list[str] | None = None) -> GateRequest:
    """A flow's parameters as the gate request (`sample_axes` as {name: axis}, the flows' JSON-friendly form)."""
    return GateRequest(Path(paths["candidate"]), Path(paths["reference"]), str(data), tuple(device_classes),
                       policy, incumbent=paths.get("incumbent"), metrics=tuple(metrics or ()),
                       sample_axes=tuple(f"{name}={axis}" for name, axis in (sample_axes or {}).items()))


def gate_in_flow(request: GateRequest, *, registry=None, build: BuildSettings | None = None,
                 remote: Remote | None = None, max_parallel: int | None = None) -> GateRun:
    """tiergate.orchestrator.gate with Prefect steps; raises the first task failure (after all ended).

    `request.data`: an .npz or a data loader FILE.py:FUNCTION (run once, here). With a `registry` the decision is
    recorded there (conclude): the candidate must be registered, checked before anything is built or run."""
    import os

    parallel = max_parallel or int(os.environ.get("TIERGATE_MAX_PARALLEL", "2"))
    options = orchestrator.RunOptions(registry=registry, records=registry is not None, max_parallel=parallel)
    return orchestrator.gate(request, flow_seams(remote, build), options)


# --- conclude: reuse or record, reports, Prefect artifacts ----------------------------------------


@dataclass
class Concluded:
    verdict: str
    decision_id: int | None
    reused_decision: bool
    cache_hits: int
    containers_started: int
    reports: dict[str, str]
    decision_cached: bool = False

    def to_json(self) -> dict:
        return dict(self.__dict__)


def conclude(gate_run: GateRun, *, registry=None, report_dir: Path | None = None,
             junit: Path | None = None, label: str = "gate", cost_tags: dict[str, str] | None = None) -> Concluded:
    """Record the decision (or reuse an identical recorded one), write reports, publish Prefect artifacts."""
    decision_id, reused = None, False
    if registry is not None:
        recorded, reused = orchestrator.record_or_reuse(registry, gate_run, cost_tags=cost_tags)
        decision_id = recorded.id
    from tiergate.reports.gate_files import write_reports

    written = write_reports(gate_run, report_dir, junit)
    publish(gate_run, label, decision_id, reused)
    return Concluded(gate_run.decision.verdict, decision_id, reused, gate_run.cache_hits,
                     gate_run.containers_started, {k: str(v) for k, v in written.items()}, gate_run.decision_cached)


def publish(gate_run: GateRun, label: str, decision_id: int | None, reused: bool) -> None:
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
             "result": "pass" if c.passed else ("INCONCLUSIVE" if c.inconclusive else "FAIL")} for c in decision.checks]
    create_table_artifact(rows, key=f"{key}-checks", description=f"tiergate checks: {decision.verdict}")


def artifact_key(label: str) -> str:
    """A Prefect artifact key (lower-case letters, digits and dashes)."""
    return "tiergate-" + (re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "gate")


def _cell(value) -> str | float | None:
    from tiergate.fmt import rounded

    return rounded(value, 6)
