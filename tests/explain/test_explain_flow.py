"""The revalidation flow's REJECT path attaches the explain table as a Markdown artifact: a real Prefect
flow in-process (no PREFECT_API_URL: a temporary local server starts) runs the orchestration task, and
the artifact is read back through Prefect's client."""

from __future__ import annotations

import pytest

import gatekit

import models
from tiergate.execution.explain import HostRunner
from tiergate.targets import resolve

X86 = "x86_64-cpu-onnxruntime"


@pytest.fixture
def prefect_env(tmp_path, monkeypatch):
    import prefect  # noqa: F401 - pinned (constraints.txt): never optional

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


@pytest.mark.prefect
@pytest.mark.slow
def test_the_explain_table_is_attached_as_markdown(tiergate_home, mlp_set, prefect_env):
    from prefect import flow
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from tiergate.orchestration.explain import attach_explain

    @flow(name="explain-on-reject-under-test")
    def on_reject():
        request = gatekit.request(mlp_set["relu_removed"], mlp_set["fp32"], mlp_set["eval"], resolve(X86), None)
        return attach_explain(request, label="mlp-abc123", runner=HostRunner())

    artifact_id = on_reject()
    key = "tiergate-mlp-abc123-explain"
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert [str(a.id) for a in found] == [artifact_id] and found[0].type == "markdown"
    markdown = found[0].data
    assert f"first divergent: `{models.TENSOR}`" in markdown and f"| `{models.TENSOR}` |" in markdown
    assert f"### `{X86}`" in markdown and found[0].flow_run_id is not None
    assert Artifact.get(key).data == markdown          # the latest artifact of that key: the same table
