"""An ONNX model specialized to what runs for the evaluation data: each top-level If whose condition the data fix
replaced by the branch it takes, so that the branch's tensors become graph tensors (exposable, paired like any other).

A tensor computed inside a subgraph (an If's branch, a Loop's or Scan's body) cannot be a graph output, so explain
cannot dump it. Many exported models hold their whole network in such a branch: silero VAD computes everything
inside `If(Equal(sr, 16000))`, then inside Ifs on tensor shapes. For the evaluation data such a condition is often
fixed: it is computed from constants, from shapes (the same in every sample: samples are fed one at a time, in one
shape) and from model inputs whose values are the same in every sample (`sr`). `specialize` then inlines the taken
branch in place of the If (its outputs renamed to the If's outputs; names it defines that collide with names outside
it renamed; references to the outer scope kept, since inlined they resolve to the same tensors, as ONNX's scoping
says), drops what no output needs any more (the condition, the branch not taken), and repeats for the Ifs that
inlining brought to the top level, until none is left whose condition is fixed.

The evidence that the condition is fixed is twofold: its computation reads no input whose values differ between
samples (a structural check), and evaluated on every sample (this machine's onnxruntime) it has one value. A
specialization is what runs for those inputs, so it must compute the same: the specialized model is run on every
sample and refused (the model kept as it is) unless its outputs equal the original's (within MAX_REL_DIFF: the
optimizer may fuse the inlined nodes with their new neighbours).

What stays inside a subgraph (a Loop or Scan body, an If whose condition varies between samples or depends on an
input that does) is listed with the reason (`Specialized.skipped`). The core (no Docker): onnx, numpy, onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_ROUNDS = 64              # nesting levels inlined at most (each round inlines every fixed top-level If)
MAX_REL_DIFF = 1e-5          # the specialized model's outputs: |a - b| <= MAX_REL_DIFF * max(1, max |a|)
SHAPE_OPS = ("Shape", "Size")
_COMPARE = {"Equal": "==", "Greater": ">", "Less": "<", "GreaterOrEqual": ">=", "LessOrEqual": "<="}


@dataclass
class Branch:
    """One If replaced by the branch the evaluation data take."""

    node: str                # the If's name (its first output's when it has none)
    branch: str              # "then_branch" or "else_branch"
    why: str                 # e.g. "sr == 16000 in every sample"

    def text(self) -> str:
        return f"{self.node}: {self.branch} ({self.why})"

    def to_json(self) -> dict:
        return {"node": self.node, "branch": self.branch, "why": self.why}


@dataclass
class Specialized:
    model: object                                   # onnx.ModelProto: specialized, or the original
    branches: list[Branch] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)    # tensor inside a subgraph left -> why
    refused: str = ""                              # why the specialization was refused ("" when it was not)
    max_abs_diff: float = 0.0                      # specialized vs original outputs on the data


def specialize(model, feeds: list[dict[str, np.ndarray]] | None) -> Specialized:
    """`model` (onnx.ModelProto, not modified) with every If its condition's values in `feeds` (one dict per sample,
    each input as the model takes it) fix inlined, checked against the original on `feeds`."""
    import onnx

    ifs = [n for n in model.graph.node if n.op_type == "If"]
    if not ifs or not feeds:
        why = "no evaluation data to fix its condition" if ifs else ""
        return Specialized(model, skipped=skipped_reasons(model.graph, {}, why))
    fixed = fixed_inputs(model.graph, feeds)
    work = onnx.ModelProto()
    work.CopyFrom(model)
    branches: list[Branch] = []
    varies: dict[str, str] = {}                     # If (by first output) -> why it stays
    for _ in range(MAX_ROUNDS):
        todo = []
        for node in work.graph.node:
            if node.op_type != "If" or node.output[0] in varies:
                continue
            moving = depends_on_varying(work.graph, node.input[0], fixed)
            if moving:
                varies[node.output[0]] = f"its condition depends on {moving}, whose values differ between samples"
            else:
                todo.append(node)
        if not todo:
            break
        try:
            values = evaluate(work, [n.input[0] for n in todo], feeds)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's refusal, in its words
            return _refused(model, f"its conditions cannot be evaluated on this machine: {_one_line(exc)}")
        taken = {}
        for node, seen in zip(todo, values):
            flat = {bool(np.asarray(v).reshape(-1)[0]) for v in seen if np.asarray(v).size}
            if len(flat) != 1:
                varies[node.output[0]] = "its condition differs between samples"
                continue
            value = flat.pop()
            taken[node.output[0]] = value
            branches.append(Branch(_name(node), "then_branch" if value else "else_branch",
                                   describe(work.graph, node.input[0], value)))
        if not taken:
            break
        for out, value in taken.items():
            node = next(n for n in work.graph.node if n.op_type == "If" and n.output[0] == out)
            inline(work.graph, node, value)
        prune(work.graph)
    if not branches:
        return Specialized(model, skipped=skipped_reasons(model.graph, varies))
    try:
        diff = max_difference(model, work, feeds)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's refusal, in its words
        return _refused(model, f"the specialized model does not run on this machine: {_one_line(exc)}")
    if diff is None or diff[0] > MAX_REL_DIFF * max(1.0, diff[1]):
        return _refused(model, "specializing it changed the model's outputs on the evaluation data"
                        + ("" if diff is None else f" (max abs difference {diff[0]:.3g})"), diff)
    return Specialized(work, branches, skipped_reasons(work.graph, varies), max_abs_diff=diff[0])


def _refused(model, why: str, diff=None) -> Specialized:
    return Specialized(model, skipped=skipped_reasons(model.graph, {}, why), refused=why,
                       max_abs_diff=float("nan") if diff is None else diff[0])


def _one_line(exc) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _name(node) -> str:
    return node.name or node.output[0]


# --- what the data fix --------------------------------------------------------------------------------------


def fixed_inputs(graph, feeds: list[dict[str, np.ndarray]]) -> set[str]:
    """The model inputs whose values are the same in every sample."""
    found = set()
    for i in graph.input:
        values = [np.asarray(f[i.name]) for f in feeds if i.name in f]
        if len(values) == len(feeds) and all(v.shape == values[0].shape and np.array_equal(v, values[0])
                                             for v in values[1:]):
            found.add(i.name)
    return found


def depends_on_varying(graph, name: str, fixed: set[str]) -> str:
    """The input whose values differ between samples that tensor `name` of `graph` is computed from ("" when none:
    constants, fixed inputs and shapes only). A shape's input counts for its shape only."""
    producer = {o: n for n in graph.node for o in n.output if o}
    inits = {t.name for t in graph.initializer}
    inputs = {i.name for i in graph.input}
    todo, seen = [name], {name}
    while todo:
        t = todo.pop()
        if t in inits:
            continue
        if t in inputs:
            if t not in fixed:
                return t
            continue
        node = producer.get(t)
        if node is None or node.op_type in SHAPE_OPS + ("Constant",):
            continue
        for i in list(node.input) + sorted(_outer_references(node)):
            if i and i not in seen:
                seen.add(i)
                todo.append(i)
    return ""


def evaluate(model, names: list[str], feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """The values of top-level tensors `names` in each sample, per name (this machine's onnxruntime, only the nodes
    they need)."""
    import onnx

    cone = onnx.ModelProto()
    cone.CopyFrom(model)
    del cone.graph.output[:]
    cone.graph.output.extend(onnx.helper.ValueInfoProto(name=n) for n in dict.fromkeys(names))
    prune(cone.graph)
    outs = _run(cone, feeds)
    index = {n: k for k, n in enumerate(dict.fromkeys(names))}
    return [[sample[index[n]] for sample in outs] for n in names]


def _run(model, feeds) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    from tiergate.ort_session import session as make_session

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    session = make_session(model.SerializeToString(), opts)
    wanted = [i.name for i in session.get_inputs()]
    return [session.run(None, {n: f[n] for n in wanted if n in f}) for f in feeds]


def max_difference(original, specialized, feeds) -> tuple[float, float] | None:
    """(max abs difference of the two models' outputs over `feeds`, max abs output of the original); None when an
    output differs in shape or kind."""
    worst, top = 0.0, 0.0
    for a_outs, b_outs in zip(_run(original, feeds), _run(specialized, feeds)):
        for a, b in zip(a_outs, b_outs):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape or a.dtype != b.dtype:
                return None
            if a.dtype.kind in "fc":
                if np.isnan(a).any() or np.isnan(b).any():
                    if not np.array_equal(np.isnan(a), np.isnan(b)):
                        return None
                    a, b = np.nan_to_num(a), np.nan_to_num(b)
                if a.size:
                    worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b))))
                    top = max(top, float(np.max(np.abs(a))))
            elif not np.array_equal(a, b):
                return None
    return worst, top


def describe(graph, name: str, value: bool) -> str:
    """Why the branch is taken, in words: "sr == 16000 in every sample"."""
    text = _expr(graph, name, 6)
    while text.startswith("not (") and text.endswith(")") and text.count("(") == text[5:-1].count("(") + 1:
        text, value = text[5:-1], not value
    if value and any(f" {op} " in text for op in _COMPARE.values()):
        return f"{text} in every sample"
    return f"{text} is {'true' if value else 'false'} in every sample"


def _expr(graph, name: str, depth: int) -> str:
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in graph.initializer}
    if name in inits:
        array = numpy_helper.to_array(inits[name])
        return _scalar(array) or name
    node = next((n for n in graph.node if name in n.output), None)
    if node is None or depth == 0:
        return name
    if node.op_type == "Constant":
        for attr in node.attribute:
            if attr.name == "value":
                return _scalar(numpy_helper.to_array(attr.t)) or name
            if attr.name in ("value_int", "value_float"):
                return str(helper.get_attribute_value(attr))
        return name
    args = [_expr(graph, i, depth - 1) for i in node.input if i]
    if node.op_type in _COMPARE and len(args) == 2:
        return f"{args[0]} {_COMPARE[node.op_type]} {args[1]}"
    if node.op_type == "Not" and args:
        return f"not ({args[0]})"
    if node.op_type in ("And", "Or") and len(args) == 2:
        return f"({args[0]}) {node.op_type.lower()} ({args[1]})"
    inner = next((n for n in graph.node if node.input and node.input[0] in n.output), None)
    boolean = inner is not None and inner.op_type in (*_COMPARE, "Not", "And", "Or")
    if node.op_type == "Cast" and args and not boolean and any(a.name == "to" and a.i == 9 for a in node.attribute):
        return f"bool({args[0]})"
    if node.op_type in ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape") and args:
        return args[0]
    if node.op_type == "Size" and inner is not None and inner.op_type == "Shape":
        return f"rank({inner.input[0]})"
    if node.op_type in SHAPE_OPS and args:
        return f"{node.op_type.lower()}({node.input[0]})"
    if node.op_type == "Gather" and len(args) == 2:
        return f"{args[0]}[{args[1]}]"
    return name


def _scalar(array: np.ndarray) -> str:
    if array.size != 1:
        return ""
    value = array.reshape(-1)[0]
    return str(bool(value)).lower() if array.dtype == bool else f"{value:g}" if array.dtype.kind == "f" else str(value)


# --- the surgery ------------------------------------------------------------------------------------------


def _subgraphs(node) -> list:
    """The body graphs a node holds (artifact.onnx_walk's, without their attribute names)."""
    from tiergate.artifact.onnx_walk import subgraphs

    return [body for _, body in subgraphs(node)]


def _defined(graph) -> set[str]:
    """The names a graph itself defines: its inputs, initializers and node outputs."""
    return ({i.name for i in graph.input} | {t.name for t in graph.initializer}
            | {o for n in graph.node for o in n.output if o})


def _outer_references(node) -> set[str]:
    """The names a node's subgraphs read from outside them (ONNX's implicit inputs)."""
    found = set()
    for body in _subgraphs(node):
        inner = _defined(body)
        for n in body.node:
            found |= {i for i in n.input if i and i not in inner}
            found |= {i for i in _outer_references(n) if i not in inner}
        found |= {o.name for o in body.output if o.name not in inner}
    return found


def _all_names(graph) -> set[str]:
    """Every value name in a graph and its subgraphs, recursively."""
    names = _defined(graph) | {o.name for o in graph.output}
    for n in graph.node:
        names |= {i for i in n.input if i}
        for body in _subgraphs(n):
            names |= _all_names(body)
    return names


def _rename(graph, names: dict[str, str], *, top: bool) -> None:
    """Apply `names` to a graph's node inputs and outputs (and, at the top, its initializers and value infos), and
    to its subgraphs' references to the outer scope (not to what a subgraph defines itself: it shadows)."""
    if top:
        for t in graph.initializer:
            t.name = names.get(t.name, t.name)
        for v in graph.value_info:
            v.name = names.get(v.name, v.name)
    for n in graph.node:
        for k, i in enumerate(n.input):
            if i in names:
                n.input[k] = names[i]
        if top:
            for k, o in enumerate(n.output):
                if o in names:
                    n.output[k] = names[o]
        for body in _subgraphs(n):
            inner = _defined(body)
            visible = {a: b for a, b in names.items() if a not in inner}
            if visible:
                _rename(body, visible, top=False)
                for o in body.output:
                    if o.name in visible:
                        o.name = visible[o.name]


def inline(graph, node, value: bool) -> None:
    """Replace If `node` of `graph` by the nodes of the branch `value` takes (in place)."""
    from onnx import helper

    body = next(a.g for a in node.attribute if a.name == ("then_branch" if value else "else_branch"))
    position = list(graph.node).index(node)
    # the names outside the If (its branches aside): a name the branch defines that is one of them is renamed
    outside = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {o.name for o in graph.output}
    for n in graph.node:
        if n is not node:
            outside |= {o for o in n.output if o} | {i for i in n.input if i}
            for sub in _subgraphs(n):
                outside |= _all_names(sub)
    own = {t.name for t in body.initializer} | {o for n in body.node for o in n.output if o}
    counts = {}
    for o in body.output:
        counts[o.name] = counts.get(o.name, 0) + 1
    names: dict[str, str] = {}
    identities = []
    for out, target in zip(body.output, node.output):
        if not target:
            continue
        produced = out.name in own and out.name not in {t.name for t in body.initializer}
        if produced and counts[out.name] == 1 and out.name not in names:
            names[out.name] = target
        else:
            identities.append((out.name, target))
    taken = set(outside) | set(node.output)
    for name in sorted(own - set(names)):
        if name in taken:
            fresh, k = f"{name}__inlined", 1
            while fresh in taken or fresh in own:
                fresh, k = f"{name}__inlined{k}", k + 1
            names[name] = fresh
            taken.add(fresh)
    copy = helper.make_graph(list(body.node), body.name, [], [], list(body.initializer), value_info=list(body.value_info))
    _rename(copy, names, top=True)
    node_names = {n.name for n in graph.node if n.name and n is not node}
    for n in copy.node:
        if n.name and n.name in node_names:
            base, fresh, k = n.name, f"{n.name}__inlined", 1
            while fresh in node_names:
                fresh, k = f"{base}__inlined{k}", k + 1
            n.name = fresh
        node_names.add(n.name)
    added = list(copy.node) + [helper.make_node("Identity", [names.get(a, a)], [b], name=f"{b}__branch_output")
                               for a, b in identities]
    graph.node.remove(node)
    for k, n in enumerate(added):
        graph.node.insert(position + k, n)
    graph.initializer.extend(copy.initializer)
    known = {v.name for v in graph.value_info} | {o.name for o in graph.output} | {i.name for i in graph.input}
    graph.value_info.extend(v for v in copy.value_info if v.name not in known)


def prune(graph) -> None:
    """Drop the nodes and initializers no graph output needs (in place; inputs stay: the signature is kept)."""
    needed = {o.name for o in graph.output}
    keep = []
    for n in reversed(list(graph.node)):
        if any(o in needed for o in n.output if o):
            keep.append(n)
            needed |= {i for i in n.input if i} | _outer_references(n)
    keep_ids = {id(n) for n in keep}
    for n in [n for n in graph.node if id(n) not in keep_ids]:
        graph.node.remove(n)
    for t in [t for t in graph.initializer if t.name not in needed]:
        graph.initializer.remove(t)
    for v in [v for v in graph.value_info if v.name not in needed]:
        graph.value_info.remove(v)


# --- what stays inside subgraphs -------------------------------------------------------------------------


def skipped_reasons(graph, varies: dict[str, str], why_if: str = "") -> dict[str, str]:
    """{tensor computed inside a subgraph of `graph`: why it stays there} (not exposable as a graph output)."""
    found: dict[str, str] = {}
    for node in graph.node:
        bodies = _subgraphs(node)
        if not bodies:
            continue
        if node.op_type == "If":
            why = varies.get(node.output[0]) or why_if or "its condition is not fixed by the evaluation data"
            reason = f"inside {_name(node)} (If): {why}"
        elif node.op_type in ("Loop", "Scan"):
            reason = f"inside {_name(node)} ({node.op_type}): its body runs once per iteration, not as graph tensors"
        else:
            reason = f"inside a subgraph of {_name(node)} ({node.op_type})"
        for body in bodies:
            for name in sorted(_all_computed(body)):
                found.setdefault(name, reason)
    return found


def _all_computed(graph) -> set[str]:
    found = {o for n in graph.node for o in n.output if o}
    for n in graph.node:
        for body in _subgraphs(n):
            found |= _all_computed(body)
    return found
