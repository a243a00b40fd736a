"""Import layering of src/tiergate, read from the source (AST), function-level imports included.

Two things fail here: an import cycle between tiergate modules, and a layer break (a
module importing what its layer may not). The layers are the table `RULES` below;
docs/ARCHITECTURE.md ("Layering") shows the same table and a test keeps the two equal.

Every `import`/`from ... import` anywhere in a file counts (module top level, inside
functions, under `if TYPE_CHECKING:`), and so does `importlib.import_module("...")` with
a literal (or f-string) prefix. `from pkg import name` is an edge to the submodule
`pkg.name` where one exists, else to the package `pkg` (its `__init__`, whose own
re-exports are edges like any other module's).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "tiergate"

CORE = (
    "tiergate.artifact", "tiergate.fingerprint", "tiergate.diff", "tiergate.lint", "tiergate.evaldata",
    "tiergate.metrics", "tiergate.stats", "tiergate.policy", "tiergate.gate", "tiergate.results",
    "tiergate.reports", "tiergate.hashing", "tiergate.errors", "tiergate.paths", "tiergate.targets",
    "tiergate.images", "tiergate.figures", "tiergate.decision", "tiergate.quickgate", "tiergate.state",
    "tiergate.request", "tiergate.usercode", "tiergate.attest", "tiergate.bisect", "tiergate.dataloader",
    "tiergate.labels", "tiergate.outputs", "tiergate.npu", "tiergate.cpunames", "tiergate.harness_source",
)
EVERYONE = ("tiergate",)


@dataclass(frozen=True)
class Rule:
    name: str
    importers: tuple[str, ...]   # modules (and everything under them) the rule applies to
    forbidden: tuple[str, ...]   # what they may not import (and everything under it)
    exempt: tuple[str, ...]      # importers the rule does not apply to
    why: str


# The layering table. docs/ARCHITECTURE.md "Layering" says the same (test_the_docs_table_is_this_table).
RULES = (
    Rule("core", CORE,
         ("prefect", "docker", "tiergate.registry", "tiergate.build", "tiergate.execution",
          "tiergate.orchestration", "tiergate.cli", "tiergate.orchestrator", "tiergate.doctor", "tiergate.demo",
          "tiergate.mlflow_bridge"),
         (), "the core imports neither Prefect, Docker, the registry nor any layer built on the core"),
    Rule("prefect", EVERYONE, ("prefect",), ("tiergate.orchestration",),
         "only tiergate.orchestration imports Prefect (flows/ is outside src)"),
    Rule("docker", EVERYONE, ("docker",), ("tiergate.build", "tiergate.execution",
                                           "tiergate.doctor"),
         "only tiergate.build (and its compile stage, tiergate.build.compiling), tiergate.execution and tiergate.doctor "
         "import Docker"),
    Rule("mlflow", EVERYONE, ("mlflow",), ("tiergate.mlflow_bridge",),
         "only tiergate.mlflow_bridge imports MLflow (lazily, inside its functions)"),
    Rule("cli", EVERYONE, ("tiergate.cli",), ("tiergate.cli",), "nothing imports tiergate.cli but tiergate.cli"),
    Rule("execution", ("tiergate.execution",), ("tiergate.orchestrator", "tiergate.build"), (),
         "the execution backends run what they are given: they call neither the orchestrator nor the builder"),
    Rule("light", ("tiergate.state", "tiergate.request", "tiergate.quickgate"),
         ("numpy", "scipy", "onnx", "onnxruntime", "sqlalchemy", "typer"), (),
         "the fast path's modules import nothing heavy (an unchanged re-run is answered before any of it loads)"),
)

# Known breaks outside this change's scope: module -> reason. Strict: when fixed, the mark must go.
KNOWN_BREAKS: dict[str, str] = {}


@dataclass(frozen=True)
class Import:
    importer: str
    target: str   # dotted name: a tiergate module, or a third-party module as written
    file: str     # as shown: relative to the folder that holds src/
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def discover(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is_package) for every .py under src/tiergate."""
    modules = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _resolve(name: str, modules: dict) -> str:
    """The longest known tiergate module that `name` lies in; third-party names as they are."""
    if not under(name, (PACKAGE,)):
        return name
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or name


def _dynamic_target(call: ast.Call) -> str | None:
    """The literal (prefix) of importlib.import_module("x.y") / import_module(f"x.y.{name}")."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if called not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip(".") or None
    return None


def imports_of(module: str, path: Path, is_package: bool, modules: dict, src: Path = SRC) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in modules else base)
        elif isinstance(node, ast.Call):
            dynamic = _dynamic_target(node)
            targets = [dynamic] if dynamic else []
        for target in targets:
            found.append(Import(module, _resolve(target, modules), str(path.relative_to(src.parent)), node.lineno))
    return found


def all_imports(src: Path = SRC) -> list[Import]:
    modules = discover(src)
    return [imp for name, (path, is_pkg) in modules.items() for imp in imports_of(name, path, is_pkg, modules, src)]


def layer_breaks(imports: list[Import]) -> list[str]:
    broken = []
    for imp in imports:
        for rule in RULES:
            if under(imp.importer, rule.importers) and not under(imp.importer, rule.exempt) \
                    and under(imp.target, rule.forbidden):
                broken.append(f"{imp.where}: {imp.importer} imports {imp.target}: breaks rule '{rule.name}' "
                              f"({rule.why})")
    return list(dict.fromkeys(broken))  # `from x import a, b` is one break


def import_cycles(imports: list[Import], modules) -> list[str]:
    """One message per strongly connected component of the tiergate import graph, naming one cycle in it."""
    edges: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for imp in imports:
        if imp.target in modules and imp.target != imp.importer:
            edges[imp.importer].setdefault(imp.target, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is a few hundred nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    messages = []
    for component in components:
        members = set(component)
        path, seen = [component[0]], {component[0]}
        while True:  # walk inside the component until a module repeats: that closes a cycle
            nxt = next(w for w in sorted(edges[path[-1]]) if w in members)
            if nxt in seen:
                path = path[path.index(nxt):] + [nxt]
                break
            path.append(nxt)
            seen.add(nxt)
        steps = [f"{edges[a][b].where}: {a} imports {b}" for a, b in zip(path, path[1:])]
        messages.append(f"import cycle among {', '.join(component)}:\n    " + "\n    ".join(steps))
    return messages


# -- the tests ---------------------------------------------------------------------------------------

MODULES = discover()
IMPORTS = all_imports()


def test_the_scan_sees_function_level_and_dynamic_imports():
    """Guards the scanner itself: imports it must see, read from files whose imports are known."""
    def targets(module):
        return {imp.target for imp in IMPORTS if imp.importer == module}

    assert "tiergate.artifact.canonical_onnx" in targets("tiergate.artifact.canonical")  # inside canonical()
    assert "tiergate.lint.rules" in targets("tiergate.lint.registry")  # import_module(f"tiergate.lint.rules.{x}")
    assert "docker" in targets("tiergate.doctor")


def test_every_layer_names_existing_modules():
    names = {n for rule in RULES for n in rule.importers + rule.forbidden + rule.exempt if under(n, (PACKAGE,))}
    missing = sorted(n for n in names if n not in MODULES)
    assert not missing, f"the layering table names modules that do not exist: {missing}"


def test_no_import_cycles():
    cycles = import_cycles(IMPORTS, MODULES)
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("module", [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BREAKS[m])) if m in KNOWN_BREAKS else m
    for m in sorted(MODULES)])
def test_no_layer_break(module):
    broken = layer_breaks([imp for imp in IMPORTS if imp.importer == module])
    assert not broken, "\n".join(broken)


def test_a_cycle_and_a_break_are_found_and_named(tmp_path):
    """The checks fail where they must: a made-up package with a function-level cycle and a core module
    importing the registry, each reported with file:line and the rule."""
    pkg = tmp_path / PACKAGE
    (pkg / "reports").mkdir(parents=True)
    (pkg / "registry").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "registry" / "__init__.py").write_text("from tiergate.registry.db import Registry\n")
    (pkg / "registry" / "db.py").write_text("class Registry:\n    pass\n")
    (pkg / "reports" / "__init__.py").write_text("from . import drift\n")
    (pkg / "reports" / "drift.py").write_text("def f():\n    from tiergate.reports.html import g\n")
    (pkg / "reports" / "html.py").write_text("import json\n\n\ndef g():\n    from tiergate import registry\n"
                                             "    from .drift import f\n")
    modules = discover(tmp_path)
    imports = all_imports(tmp_path)
    cycles = import_cycles(imports, modules)
    assert len(cycles) == 1 and "tiergate.reports.drift, tiergate.reports.html" in cycles[0]
    assert re.search(r"drift\.py:2: tiergate\.reports\.drift imports tiergate\.reports\.html", cycles[0])
    assert re.search(r"html\.py:6: tiergate\.reports\.html imports tiergate\.reports\.drift", cycles[0])
    broken = layer_breaks(imports)
    assert len(broken) == 1 and re.search(r"html\.py:5: .* imports tiergate\.registry: breaks rule 'core'", broken[0])


def _docs_table() -> dict[str, tuple[tuple[str, ...], ...]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layering", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = tuple(tuple(re.findall(r"`([^`]+)`", c)) for c in cells[1:])
    return rows


def test_the_docs_table_is_this_table():
    expected = {r.name: (r.importers, r.forbidden, r.exempt) for r in RULES}
    assert _docs_table() == expected, "docs/ARCHITECTURE.md 'Layering' table differs from tests/test_layering.py RULES"
