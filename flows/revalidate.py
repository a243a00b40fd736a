"""Revalidate a registered artifact: the flow a `tiergate.artifact.registered` event triggers.

intake (fingerprint, diff against the model's previous artifact, lint) → build images
per device class → run targets in parallel (retries for infrastructure faults only;
classes mapped to a work pool run on a worker there) → compare → gate → record → report;
on REJECT, `tiergate explain`'s table is attached as a Markdown artifact.
An unchanged input reuses recorded results. An artifact registered from MLflow (flows/mlflow_watch.py) gets
its version tagged with the verdict. Deployed by `tiergate serve` and prefect.yaml.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from tiergate.orchestration.explain import attach_explain
from tiergate.errors import TiergateError
from tiergate.orchestration.gating import Remote, conclude, flow_request, gate_in_flow
from tiergate.orchestration.mlflow_watch import tag_revalidated
from tiergate.orchestration.revalidation import prepare
from tiergate.orchestration.tasks import diff_task
from tiergate.paths import home
from tiergate.policy import load_policy
from tiergate.registry import Registry
from tiergate.request import BuildSettings


@flow(name="tiergate-revalidate", task_runner=ThreadPoolTaskRunner(max_workers=6), log_prints=True)
def revalidate(artifact: str, data: str, targets: str | None = None, policy: str | None = None,
               registry_url: str | None = None, store: str | None = None,
               remote: dict[str, str] | None = None, report_dir: str | None = None,
               base_image: str | None = None, sample_axes: dict[str, int] | None = None,
               metrics: list[str] | None = None) -> dict:
    """Gate a registered artifact (sha256, prefix or `tiergate.artifact.<sha256>`) against its FP32 reference."""
    log = get_run_logger()
    loaded_policy = load_policy(policy)
    with Registry(registry_url, store) as registry:
        job = prepare(registry, artifact, targets, home() / "flows")
        short = job.record.short
        log.info("revalidating %s (%s, %s) on %s", short, job.record.model, job.record.precision,
                 ", ".join(dc.name for dc in job.device_classes))
        diff = diff_task.submit(*job.previous, job.paths["candidate"]) if job.previous else None
        remote_spec = Remote(dict(remote or {}), str(Path(data).resolve()), registry.url, registry.store.location)
        request = flow_request(job.paths, data, job.device_classes, loaded_policy, sample_axes, metrics)
        gate_run = gate_in_flow(request, registry=registry, build=BuildSettings(base_image), remote=remote_spec)
        reports = Path(report_dir) / short if report_dir else home() / "flows" / "reports" / short
        done = conclude(gate_run, registry=registry, report_dir=reports, junit=reports / "junit.xml",
                        label=f"{job.record.model}-{short}", cost_tags={"flow": "revalidate"})
        if done.verdict == "REJECT":     # which layer lost it, per tier: a Markdown artifact on the run
            attach_explain(request, label=f"{job.record.model}-{short}", build=BuildSettings(base_image))
    try:                                 # an artifact from MLflow (flows/mlflow_watch.py): its version tagged
        mlflow = tag_revalidated(job.record, gate_run, done.reports)
    except TiergateError as exc:         # the decision is recorded; only the tags are missing
        mlflow = [f"not updated: {exc.one_line()}"]
        log.warning("%s: MLflow %s", short, mlflow[0])
    summary = done.to_json() | {"artifact": job.record.sha256, "model": job.record.model}
    if mlflow:
        summary["mlflow"] = mlflow
    if diff is not None:
        changes = diff.result()
        summary["diff"] = {"previous": job.previous[1], "identical": changes["identical"], "same": changes["same"]}
    log.info("%s: %s (decision %s, %d runs started, %d reused)", short, done.verdict, done.decision_id,
             done.containers_started, done.cache_hits)
    return summary
