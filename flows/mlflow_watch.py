"""Poll MLflow's model registry: each new version of a model is revalidated as a `tiergate register` would be.

Wiring only: tiergate.orchestration.mlflow_watch.watch lists the versions newer than the last one seen (kept
under the tiergate home), registers each with its FP32 reference and emits `tiergate.artifact.registered`,
which the `on-register` deployment (flows/revalidate.py) answers. Scheduled in prefect.yaml (docs/prefect.md).
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from tiergate.orchestration.mlflow_watch import watch


@flow(name="tiergate-mlflow-watch", log_prints=True)
def mlflow_watch(model: str, reference: str, registry_url: str | None = None, store: str | None = None) -> list[dict]:
    """Trigger the revalidation of each new version of MLflow model `model` (reference: a file or models:/ URI)."""
    log = get_run_logger()
    triggered = watch(model, reference, registry_url=registry_url, store=store)
    for t in triggered:
        log.info("%s version %s: registered %s, event %s", model, t.version, t.sha256[:12], t.event)
    if not triggered:
        log.info("%s: no new version", model)
    return [t.to_json() for t in triggered]
