"""Sizes (issue 44): no module over 600 lines, no class over 200 lines, read from the source (AST).

Walks the Python files of src/tiergate, containers/ (the harness included), flows/, bench/ and scripts/. A module's
size is its number of lines; a class's is from its `class` line to its last line (nested classes count on their
own, and inside their enclosing class). Each failure names every offender with its file and size, largest first.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("src/tiergate", "containers", "flows", "bench", "scripts")
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 200


def python_files(root: Path = ROOT, folders: tuple[str, ...] = FOLDERS) -> list[Path]:
    return sorted(p for folder in folders for p in (root / folder).rglob("*.py")
                  if "__pycache__" not in p.parts and p.is_file())


def module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def class_sizes(path: Path) -> list[tuple[str, int, int]]:
    """(dotted class name, its first line, its number of lines) for every class in the file, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, f"{prefix}{child.name}.<locals>.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def oversized_modules(files: list[Path], root: Path = ROOT, limit: int = MAX_MODULE_LINES) -> list[str]:
    sizes = [(module_lines(p), p) for p in files]
    return [f"{p.relative_to(root)}: {n} lines (at most {limit})"
            for n, p in sorted(sizes, key=lambda s: (-s[0], s[1])) if n > limit]


def oversized_classes(files: list[Path], root: Path = ROOT, limit: int = MAX_CLASS_LINES) -> list[str]:
    sizes = [(n, p, name, line) for p in files for name, line, n in class_sizes(p)]
    return [f"{p.relative_to(root)}:{line}: class {name}: {n} lines (at most {limit})"
            for n, p, name, line in sorted(sizes, key=lambda s: (-s[0], s[1], s[3])) if n > limit]


FILES = python_files()


def test_the_walk_sees_every_folder():
    """Guards the walk itself: each folder holds Python files it reads, the harness among them."""
    for folder in FOLDERS:
        assert any(p.is_relative_to(ROOT / folder) for p in FILES), f"no Python file found under {folder}/"
    assert ROOT / "containers" / "harness" / "tiergate_harness.py" in FILES


def test_no_module_over_600_lines():
    too_long = oversized_modules(FILES)
    assert not too_long, "modules over 600 lines (split them into the shape of their neighbours):\n    " + \
        "\n    ".join(too_long)


def test_no_class_over_200_lines():
    too_long = oversized_classes(FILES)
    assert not too_long, "classes over 200 lines (split them by responsibility):\n    " + "\n    ".join(too_long)


def test_oversized_modules_and_classes_are_found_and_named(tmp_path):
    """The checks fail where they must: a made-up tree with a long module, a long class and a long nested class,
    each named with its file (and line) and size; what is at the limit passes."""
    pkg = tmp_path / "src" / "tiergate"
    pkg.mkdir(parents=True)
    (pkg / "ok.py").write_text("x = 1\n" * 600)
    (pkg / "long.py").write_text("x = 1\n" * 601)
    body = "    a = 1\n"
    (pkg / "classes.py").write_text("class Fits:\n" + body * 199 + "\n\nclass Big:\n" + body * 200)
    (pkg / "nested.py").write_text("def f():\n    class Inner:\n" + "        a = 1\n" * 201)
    files = python_files(tmp_path, ("src/tiergate",))
    assert oversized_modules(files, tmp_path) == ["src/tiergate/long.py: 601 lines (at most 600)"]
    assert oversized_classes(files, tmp_path) == [
        "src/tiergate/nested.py:2: class f.<locals>.Inner: 202 lines (at most 200)",
        "src/tiergate/classes.py:203: class Big: 201 lines (at most 200)"]
