"""Position-matched diff of two artifacts.

Nodes are matched by their place in the graph, not by name: the two op
sequences (topological order) are aligned (difflib), so an inserted Identity is
one added node rather than every later node renamed. Matched nodes are compared
for op, attributes, wiring (translated through the alignment), weights and
quantization parameters.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from tiergate.artifact.canonical import CanonGraph, CanonNode, canonical
from tiergate.artifact.graph import precision_counts
from tiergate.artifact.model import Artifact
from tiergate.fingerprint import Fingerprint, fingerprint_graph

_REF = re.compile(r"^n(\d+)([:/].+)$")  # "n3:0" (output 0 of node 3), "n3/body/in1" (input 1 of node 3's body)


@dataclass(frozen=True)
class Change:
    what: str      # "op" | "attribute" | "inputs" | "weights" | "quantization" | "outputs"
    key: str       # attribute name or slot ("in1", "out0"); "" for op
    old: str
    new: str

    def to_json(self) -> dict:
        return {"what": self.what, "key": self.key, "old": self.old, "new": self.new}


@dataclass
class NodeChange:
    old_index: int
    new_index: int
    op: str
    name: str
    changes: list[Change]

    def to_json(self) -> dict:
        return {"old_index": self.old_index, "new_index": self.new_index, "op": self.op, "name": self.name,
                "changes": [c.to_json() for c in self.changes]}


@dataclass
class ArtifactDiff:
    old: Fingerprint
    new: Fingerprint
    formats: tuple[str, str]
    added: list[CanonNode] = field(default_factory=list)
    removed: list[CanonNode] = field(default_factory=list)
    changed: list[NodeChange] = field(default_factory=list)
    op_counts: dict[str, tuple[int, int]] = field(default_factory=dict)   # op -> (old, new), changed ops only
    precision: dict[str, dict[str, int]] = field(default_factory=dict)    # "old"/"new" -> quantized/float counts
    io_changes: list[Change] = field(default_factory=list)

    @property
    def same(self) -> dict[str, bool]:
        return {part: getattr(self.old, part) == getattr(self.new, part)
                for part in ("structure", "weights", "quantization")}

    @property
    def identical(self) -> bool:
        return all(self.same.values())

    def to_json(self) -> dict:
        return {
            "identical": self.identical,
            "same": self.same,
            "formats": {"old": self.formats[0], "new": self.formats[1]},
            "fingerprints": {"old": self.old.to_json(), "new": self.new.to_json()},
            "added": [_node_json(n) for n in self.added],
            "removed": [_node_json(n) for n in self.removed],
            "changed": [c.to_json() for c in self.changed],
            "graph_io": [c.to_json() for c in self.io_changes],
            "op_counts": {op: {"old": o, "new": n, "delta": n - o} for op, (o, n) in sorted(self.op_counts.items())},
            "precision": self.precision,
        }


def _node_json(node: CanonNode) -> dict:
    return {"index": node.index, "op": node.op, "name": node.name}


def diff_artifacts(old: Artifact, new: Artifact) -> ArtifactDiff:
    old_graph, new_graph = canonical(old), canonical(new)
    result = ArtifactDiff(
        old=fingerprint_graph(old_graph, old.format),
        new=fingerprint_graph(new_graph, new.format),
        formats=(old.format, new.format),
        precision={"old": precision_counts(old), "new": precision_counts(new)},
    )
    _match_nodes(result, old_graph, new_graph)
    result.io_changes = _io_changes(old_graph, new_graph)
    counts_old, counts_new = old.op_counts, new.op_counts
    result.op_counts = {op: (counts_old.get(op, 0), counts_new.get(op, 0))
                        for op in set(counts_old) | set(counts_new) if counts_old.get(op) != counts_new.get(op)}
    return result


def _match_nodes(result: ArtifactDiff, old: CanonGraph, new: CanonGraph) -> None:
    # align on op plus the shapes of the constants it reads (tells conv1 from conv2), pair leftovers on op
    matcher = difflib.SequenceMatcher(a=[_key(n) for n in old.nodes], b=[_key(n) for n in new.nodes], autojunk=False)
    keys_old = [(n.domain, n.op) for n in old.nodes]
    keys_new = [(n.domain, n.op) for n in new.nodes]
    pairs: list[tuple[int, int]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            pairs += list(zip(range(i1, i2), range(j1, j2)))
            continue
        block = _pair_same_ops(keys_old, keys_new, range(i1, i2), range(j1, j2))
        pairs += block
        result.removed += [old.nodes[i] for i in range(i1, i2) if i not in {a for a, _ in block}]
        result.added += [new.nodes[j] for j in range(j1, j2) if j not in {b for _, b in block}]
    pairs.sort()
    position = dict(pairs)
    for i, j in pairs:
        changes = _compare(old.nodes[i], new.nodes[j], position)
        if changes:
            node = new.nodes[j]
            result.changed.append(NodeChange(i, j, node.op, node.name, changes))


def _key(node: CanonNode) -> tuple:
    return (node.domain, node.op, tuple(r for r in node.inputs if r.startswith("c:")))


def _pair_same_ops(keys_old, keys_new, olds: range, news: range) -> list[tuple[int, int]]:
    """Inside an unequal block, pair nodes of the same op in order; the rest are added or removed."""
    pairs, start = [], news.start
    for i in olds:
        j = next((j for j in range(start, news.stop) if keys_new[j] == keys_old[i]), None)
        if j is not None:
            pairs.append((i, j))
            start = j + 1
    return pairs


def _translate(ref: str, position: dict[int, int]) -> str:
    """An old wiring reference in new-graph terms (n3:0 -> n4:0 when node 3 became node 4)."""
    match = _REF.match(ref)
    if not match:
        return ref
    moved = position.get(int(match.group(1)))
    return f"n{moved}{match.group(2)}" if moved is not None else f"removed-{ref}"


def _compare(a: CanonNode, b: CanonNode, position: dict[int, int]) -> list[Change]:
    changes = []
    if (a.domain, a.op) != (b.domain, b.op):
        changes.append(Change("op", "", _qualified(a), _qualified(b)))
    for key in sorted(set(a.attrs) | set(b.attrs)):
        if a.attrs.get(key) != b.attrs.get(key):
            changes.append(Change("attribute", key, a.attrs.get(key, "(absent)"), b.attrs.get(key, "(absent)")))
    translated = tuple(_translate(r, position) for r in a.inputs)
    if translated != b.inputs:
        changes.append(Change("inputs", "", ", ".join(translated), ", ".join(b.inputs)))
    if a.outputs != b.outputs:
        changes.append(Change("outputs", "", ", ".join(a.outputs), ", ".join(b.outputs)))
    for kind, left, right in (("weights", a.weights, b.weights), ("quantization", a.quant, b.quant)):
        for slot in sorted(set(left) | set(right)):
            if left.get(slot) != right.get(slot):
                changes.append(Change(kind, slot, _short(kind, left.get(slot)), _short(kind, right.get(slot))))
    return changes


def _qualified(node: CanonNode) -> str:
    return f"{node.domain}::{node.op}" if node.domain else node.op


def _short(kind: str, value: str | None) -> str:
    if value is None:
        return "(none)"
    return f"sha256:{value[:16]}" if kind == "weights" else value


def _io_changes(old: CanonGraph, new: CanonGraph) -> list[Change]:
    changes = []
    if old.inputs != new.inputs:
        changes.append(Change("inputs", "graph", ", ".join(old.inputs), ", ".join(new.inputs)))
    if len(old.outputs) != len(new.outputs):
        changes.append(Change("outputs", "graph", str(len(old.outputs)), str(len(new.outputs))))
    return changes
