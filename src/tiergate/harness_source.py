"""What the host reads of the harness's own source (containers/harness/): its modules' top-level constants.

The harness runs in the runtime containers on numpy and the runtime only, and its modules may import either at
their top, so the host never imports them: it reads `NAME = literal` assignments from their source (AST,
`ast.literal_eval`), once per file version. Where the host and the harness must agree on a fact, the harness
holds it and the host reads it here:

- `harness_cpu.py`: the CPU feature names the harness reports (`cpunames.known_features`);
- `harness_batched.py`: `CALLS_AT_ONCE`, the runtimes whose calls may run at once in one process (the harness
  makes concurrent calls only for these; `spans.spread_workers` spreads a tier's calls over one container only
  for these): `calls_at_once()`.

Stdlib only.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

from tiergate.paths import containers_dir

HARNESS_DIR = "harness"
CALLS_MODULE = "harness_batched.py"
CALLS_NAME = "CALLS_AT_ONCE"


def harness_file(module: str) -> Path:
    """containers/harness/<module> (a file name: "harness_cpu.py")."""
    return containers_dir() / HARNESS_DIR / module


@functools.lru_cache(maxsize=8)
def _literals(path: str, mtime_ns: int) -> dict[str, object]:
    tree = ast.parse(Path(path).read_text())
    values: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


def literals(module: str) -> dict[str, object]:
    """The harness module's top-level `NAME = literal` values by name. OSError when the file is not here,
    SyntaxError when it does not parse."""
    path = harness_file(module)
    return _literals(str(path), os.stat(path).st_mtime_ns)


def calls_at_once() -> frozenset[str]:
    """The runtimes whose calls may run at once in one harness process (harness_batched.CALLS_AT_ONCE). Where the
    harness's source is not here, none: a tier's samples then go over shards, as for any other runtime."""
    try:
        values = literals(CALLS_MODULE)
    except OSError:
        return frozenset()
    return frozenset(values[CALLS_NAME])
