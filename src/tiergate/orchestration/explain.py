"""On REJECT, the revalidation flow attaches `tiergate explain`'s table (the worst layers per tier and
the first divergent one) to its run as a Markdown artifact."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from tiergate.errors import TiergateError
from tiergate.orchestration.gating import artifact_key
from tiergate.request import BuildSettings, GateRequest


@task(name="explain-on-reject", retries=0)
def attach_explain(request: GateRequest, *, label: str, build: BuildSettings | None = None,
                   runner=None) -> str | None:
    """Run explain on the request's tiers and attach its Markdown table; returns the artifact id (None when
    explain itself could not run: the verdict stands, the reason is logged in the table instead)."""
    from tiergate.execution.explain import explain
    from tiergate.explain import markdown_table
    from tiergate.orchestrator.explain_ab import docker_runner

    try:
        result = explain(Path(request.candidate), Path(request.reference), Path(request.data),
                         list(request.device_classes), request.policy, runner=runner or docker_runner(build))
        markdown = markdown_table(result)
    except TiergateError as exc:
        markdown = f"## Which layer, on which tier\n\nexplain could not run: {exc.one_line()}\n"
    artifact_id = create_markdown_artifact(markdown=markdown, key=f"{artifact_key(label)}-explain",
                                           description=f"tiergate explain of {label} (REJECT)")
    return str(artifact_id) if artifact_id is not None else None
