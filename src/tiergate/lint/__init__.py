"""Lint rules over a loaded artifact: `lint(artifact, device_class=None) -> [Finding]`.

Each rule lives in its own module under lint/rules/ and is listed in registry.py.
"""

from __future__ import annotations

from tiergate.artifact.graph import index_graph, node_precision
from tiergate.artifact.model import Artifact
from tiergate.lint.finding import SEVERITIES, Finding, LintContext
from tiergate.lint.registry import all_rules, rule_ids

__all__ = ["Finding", "lint", "rule_ids", "SEVERITIES"]


def lint(artifact: Artifact, device_class=None, *, only: list[str] | None = None) -> list[Finding]:
    """Every rule's findings, errors first, then by node position."""
    index = index_graph(artifact)
    ctx = LintContext(artifact, device_class, index, node_precision(artifact, index))
    findings: list[Finding] = []
    for module in all_rules():
        if only is None or module.RULE in only:
            findings.extend(module.check(ctx))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (order[f.severity], f.nodes[:1] or (-1,), f.rule))
