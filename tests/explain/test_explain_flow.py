"""The revalidation flow's REJECT path attaches the explain table as a Markdown artifact."""

from __future__ import annotations

import pytest

import models
from tiergate.execution.explain import HostRunner
from tiergate.targets import resolve

pytest.importorskip("prefect")


def test_the_explain_table_is_attached_as_markdown(tiergate_home, mlp_set, monkeypatch):
    from tiergate.orchestration import explain as orch

    attached = {}
    monkeypatch.setattr(orch, "create_markdown_artifact",
                        lambda markdown, key, description: attached.update(markdown=markdown, key=key) or "id-1")
    got = orch.attach_explain.fn(mlp_set["relu_removed"], mlp_set["fp32"], mlp_set["eval"],
                                 resolve("x86_64-cpu-onnxruntime"), None, label="mlp-abc123", runner=HostRunner())
    assert got == "id-1" and attached["key"] == "tiergate-mlp-abc123-explain"
    assert f"first divergent: `{models.TENSOR}`" in attached["markdown"]
    assert f"| `{models.TENSOR}` |" in attached["markdown"]

