"""The deployments `tiergate serve` serves, built from the flow files in flows/.

- `tiergate-revalidate/on-register`: triggered by each `tiergate.artifact.registered`
  event (emitted by `tiergate register`), the artifact passed as the event's resource id;
- `tiergate-gate/release-gate`: release gating, run on demand (CD, `prefect deployment run`);
- `tiergate-drift-report/scheduled`: the drift report on a cron or interval schedule;
- `tiergate-run-target/<pool>`: per work pool, for workers on device hosts (deployed to the
  pool, not served: a worker there runs it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tiergate.paths import project_root

from tiergate.orchestration.events import EVENT  # noqa: F401 - the trigger expects it
RESOURCE_MATCH = "tiergate.artifact.*"
FLOW_FILES = {"revalidate": "revalidate.py:revalidate", "gate": "gate.py:gate",
              "drift_report": "drift_report.py:drift_report", "run_target": "run_target.py:run_target",
              "mlflow_watch": "mlflow_watch.py:mlflow_watch"}


@dataclass
class ServeSettings:
    data: str
    registry_url: str
    store: str
    targets: str | None = None
    policy: str | None = None
    report_dir: str | None = None
    remote: dict[str, str] = field(default_factory=dict)   # device class -> work pool
    drift_out: str | None = None
    drift_cron: str | None = "0 6 * * *"
    drift_every_s: int | None = None


def flows_dir() -> Path:
    return project_root() / "flows"


def load_flow(name: str):
    """A flow from flows/ by short name (revalidate, gate, drift_report, run_target)."""
    from prefect.flows import load_flow_from_entrypoint

    file, function = FLOW_FILES[name].split(":")
    return load_flow_from_entrypoint(f"{flows_dir() / file}:{function}")


def registered_trigger():
    """Run revalidate for each registered artifact; the artifact is the event's resource id."""
    from prefect.events import DeploymentEventTrigger

    return DeploymentEventTrigger(name="on tiergate.artifact.registered", expect={EVENT},
                                  match={"prefect.resource.id": RESOURCE_MATCH},
                                  parameters={"artifact": "{{ event.resource.id }}"})


def served_deployments(settings: ServeSettings) -> list:
    """RunnerDeployments for prefect.serve: revalidate (event trigger), gate (on demand), drift (schedule)."""
    common = {"registry_url": settings.registry_url}
    revalidate = load_flow("revalidate").to_deployment(
        name="on-register", triggers=[registered_trigger()], tags=["tiergate"],
        parameters=_given(common | {"store": settings.store, "data": settings.data, "targets": settings.targets,
                                    "policy": settings.policy, "report_dir": settings.report_dir,
                                    "remote": settings.remote or None}))
    gate = load_flow("gate").to_deployment(name="release-gate", tags=["tiergate"],
                                           parameters=_given(common | {"policy": settings.policy}))
    schedule = ({"interval": settings.drift_every_s} if settings.drift_every_s else {"cron": settings.drift_cron})
    drift = load_flow("drift_report").to_deployment(
        name="scheduled", tags=["tiergate"], **schedule,
        parameters=_given(common | {"store": settings.store, "out_dir": settings.drift_out}))
    return [revalidate, gate, drift]


def ensure_work_pool(pool: str, pool_type: str = "process") -> None:
    """Create the work pool when it does not exist yet."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(pool)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=pool, type=pool_type))


def deploy_run_target(pool: str, source: Path | None = None):
    """Deploy the run-target flow to a work pool; a worker started there (`prefect worker start
    --pool POOL`) pulls the code from `source` (default: this checkout, which must exist at the same
    path on the worker's host; use a git URL for other hosts)."""
    from prefect import Flow

    ensure_work_pool(pool)
    flow = Flow.from_source(source=str(source or project_root()), entrypoint=f"flows/{FLOW_FILES['run_target']}")
    deployment = flow.to_deployment(name=pool, work_pool_name=pool, tags=["tiergate", "device-host"])
    return deployment.apply()


def _given(parameters: dict) -> dict:
    return {k: v for k, v in parameters.items() if v is not None}


def serve_all(settings, limit: int, echo) -> None:
    """Deploy the run-target flow per work pool, then serve the deployments (blocks until stopped)."""
    from prefect import serve

    for pool in sorted(set(settings.remote.values())):
        deploy_run_target(pool)
        echo(f"deployed tiergate-run-target/{pool}: start a worker with `prefect worker start --pool {pool}`")
    deployments = served_deployments(settings)
    for d in deployments:
        echo(f"serving {d.flow_name}/{d.name}")
    serve(*deployments, limit=limit, print_starting_message=False)
