"""The one console the CLI prints tables with: a terminal's width (at least `min_width`), and off a terminal (a
pipe, a file, CI's log) no width at all, so that a table's messages are never folded to a screen that is not there
(rich's default there is 80 columns: a lint message wrapped at 20 characters). COLUMNS, when set, is honoured."""

from __future__ import annotations

import os

from rich.console import Console

UNFOLDED = 100_000        # off a terminal: wider than any line a table holds


def console(min_width: int = 0, *, stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    if probe.is_terminal or os.environ.get("COLUMNS"):
        return Console(stderr=stderr, width=max(probe.width, min_width))
    return Console(stderr=stderr, width=UNFOLDED)
