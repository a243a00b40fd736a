"""Lint rules over a loaded artifact: `lint(artifact, device_class=None) -> [Finding]`.

Each rule lives in its own module under lint/rules/ and is listed in registry.py.
"""

from __future__ import annotations

from tiergate.artifact.graph import index_graph, node_precision
from tiergate.artifact.model import Artifact
from tiergate.lint.finding import SEVERITIES, Finding, LintContext
from tiergate.lint.registry import all_rules, rule_ids

__all__ = ["Finding", "lint", "rule_ids", "SEVERITIES"]


# rules whose answer lies in the graph the runtime executes: judged there when it is known
GRAPH_RULES = frozenset({"unfused-activation", "unfolded-batchnorm", "float-island", "layout-reorder",
                         "provider-fallback"})


def lint(artifact: Artifact, device_class=None, *, only: list[str] | None = None, runtime=None) -> list[Finding]:
    """Every rule's findings, errors first, then by node position.

    runtime: the device class's RuntimeGraph (tiergate.runtime_graph, made in its container).
    With it, the graph rules judge the optimized graph at the tier's own level (ONNX) or the
    graph as the interpreter runs it (TFLite), unsupported-op asks what the runtime really
    loaded, and provider-fallback reads the placement; those findings name the tier.
    """
    index = index_graph(artifact)
    ctx = LintContext(artifact, device_class, index, node_precision(artifact, index), runtime=runtime)
    graph_ctx = _runtime_context(artifact, device_class, runtime) or ctx
    findings: list[Finding] = []
    for module in all_rules():
        if only is None or module.RULE in only:
            findings.extend(module.check(graph_ctx if module.RULE in GRAPH_RULES else ctx))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (order[f.severity], f.basis, f.nodes[:1] or (-1,), f.rule))


def _runtime_context(artifact: Artifact, device_class, runtime) -> LintContext | None:
    if runtime is None or not runtime.ok or device_class is None:
        return None
    if runtime.runtime == "tvm":
        return _lowered_context(artifact, device_class, runtime)
    if runtime.runtime == "ethos-u":
        return None       # the reference kernels run the file as it is: its graph rules judge the file (npu-fallback: Vela)
    graph = runtime.runtime_artifact if artifact.format == "onnx" else artifact
    if graph is None:
        return None
    where = (f"{device_class.name}: onnxruntime level {runtime.default_level}" if artifact.format == "onnx"
             else f"{device_class.name}: LiteRT")
    index = index_graph(graph)
    fused = artifact.format == "onnx"  # onnxruntime's optimized graph: the Q/DQ it could fuse are fused
    return LintContext(graph, device_class, index, node_precision(graph, index, fused=fused), runtime=runtime,
                       basis="runtime", where=where)


def _lowered_context(artifact: Artifact, device_class, runtime) -> LintContext | None:
    """A compiled tier (TVM): the graph rules judge the kernels its compile lowered the model to."""
    from tiergate.lint import kernels

    graph = kernels.kernel_artifact(runtime, artifact)
    if graph is None:
        return None
    after = (runtime.compile or {}).get("kernels_after") or "its graph passes"
    return LintContext(graph, device_class, index_graph(graph), kernels.precision(graph), runtime=runtime,
                       basis="runtime", where=f"{device_class.name}: TVM's lowered graph after {after}")
