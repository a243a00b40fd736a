"""A lint finding: which rule, how bad, what it means and which nodes it points at."""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str                       # "error" | "warning" | "info"
    message: str
    nodes: tuple[int, ...] = ()         # node indices in the artifact's topological order
    node_names: tuple[str, ...] = ()    # the same nodes' paths ("If_0/then_branch/Conv_3"), for people
    # what was judged: "file" (the artifact as written) or "runtime" (the graph a tier's runtime runs)
    basis: str = "file"
    target: str = ""                    # the device class whose runtime graph was judged ("" for the file)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def to_json(self) -> dict:
        return {"rule": self.rule, "severity": self.severity, "message": self.message,
                "nodes": list(self.nodes), "node_names": list(self.node_names),
                "basis": self.basis, "target": self.target}


@dataclass
class LintContext:
    """What every rule may read: the artifact, the target device class, and the graph index."""

    artifact: object
    device_class: object | None
    index: object
    precision: list[str] = field(default_factory=list)
    runtime: object | None = None       # tiergate.runtime_graph.RuntimeGraph of the device class, if described
    basis: str = "file"                 # "runtime": `artifact` is the graph the tier's runtime runs
    where: str = ""                     # "x86_64-cpu-onnxruntime, onnxruntime level all" (runtime basis)
    memo: dict = field(default_factory=dict)   # what a rule reads once per graph (unfolded-batchnorm's constants)

    def finding(self, rule: str, severity: str, message: str, nodes=()) -> Finding:
        nodes = tuple(nodes)
        names = tuple(self.artifact.nodes[i].label for i in nodes)
        if self.basis == "runtime":
            return Finding(rule, severity, f"[{self.where}] {message}", nodes, names, "runtime",
                           self.device_class.name)
        return Finding(rule, severity, message, nodes, names)

    def file_finding(self, rule: str, severity: str, message: str, nodes=()) -> Finding:
        """A finding of a rule whose real answer lies in the runtime graph: says when it judged the file."""
        return self.finding(rule, severity, message + ("" if self.basis == "runtime" else f" [{FILE_ONLY}]"), nodes)


FILE_ONLY = "judged on the file only: --target CLASS judges the graph that tier's runtime runs"
