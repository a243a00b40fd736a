"""On REJECT, the revalidation flow attaches `tiergate explain`'s table (the worst layers per tier and
the first divergent one) to its run as a Markdown artifact."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from tiergate.errors import TiergateError
from tiergate.orchestration.gating import artifact_key


@task(name="explain-on-reject", retries=0)
def attach_explain(candidate: Path, reference: Path, data: Path, device_classes, policy, *, label: str,
                   base_image: str | None = None, runner=None) -> str | None:
    """Run explain on the same tiers and attach its Markdown table; returns the artifact id (None when
    explain itself could not run: the verdict stands, the reason is logged in the table instead)."""
    from tiergate.execution.explain import DockerRunner, explain
    from tiergate.explain import markdown_table

    try:
        result = explain(Path(candidate), Path(reference), Path(data), device_classes, policy,
                         runner=runner or DockerRunner(base_image))
        markdown = markdown_table(result)
    except TiergateError as exc:
        markdown = f"## Which layer, on which tier\n\nexplain could not run: {exc.one_line()}\n"
    artifact_id = create_markdown_artifact(markdown=markdown, key=f"{artifact_key(label)}-explain",
                                           description=f"tiergate explain of {label} (REJECT)")
    return str(artifact_id) if artifact_id is not None else None
