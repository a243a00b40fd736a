"""Release gating as a flow (CD): gate candidate files on device classes, write JUnit + Markdown, record.

The same steps as `tiergate gate`, as Prefect tasks. With `fail_on_reject` a REJECT
fails the flow run (a CD pipeline waiting on the run sees it as a failure).
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from tiergate.errors import TiergateError
from tiergate.orchestration.gating import conclude, flow_request, gate_in_flow
from tiergate.policy import load_policy
from tiergate.registry import Registry
from tiergate.request import BuildSettings
from tiergate.targets import catalogue, resolve


class GateRejected(TiergateError):
    exit_code = 1


@flow(name="tiergate-gate", task_runner=ThreadPoolTaskRunner(max_workers=6), log_prints=True)
def gate(candidate: str, reference: str, data: str, targets: str, incumbent: str | None = None,
         policy: str | None = None, registry_url: str | None = None, report_dir: str | None = None,
         junit: str | None = None, base_image: str | None = None, fail_on_reject: bool = False,
         sample_axes: dict[str, int] | None = None, metrics: list[str] | None = None) -> dict:
    """PROMOTE or REJECT a candidate file; the decision is recorded when a registry is given."""
    device_classes = resolve(targets)
    loaded_policy = load_policy(policy)
    loaded_policy.check_override_names(list(catalogue().values()))
    paths = {"candidate": Path(candidate), "reference": Path(reference)}
    if incumbent:
        paths["incumbent"] = Path(incumbent)
    registry = Registry(registry_url) if registry_url else None
    try:
        request = flow_request(paths, data, device_classes, loaded_policy, sample_axes, metrics)
        gate_run = gate_in_flow(request, registry=registry, build=BuildSettings(base_image))
        done = conclude(gate_run, registry=registry, report_dir=Path(report_dir) if report_dir else None,
                        junit=Path(junit) if junit else None, label=f"gate-{Path(candidate).stem}")
    finally:
        if registry is not None:
            registry.close()
    if fail_on_reject and done.verdict != "PROMOTE":
        raise GateRejected(f"{candidate}: {done.verdict}: " + "; ".join(gate_run.decision.reasons))
    return done.to_json()
