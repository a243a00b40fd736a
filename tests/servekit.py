"""Servers the tests start that run none of tiergate's code (a Prefect server): started without coverage.

make test measures coverage in every Python child process (pyproject's [tool.coverage.run] patch = subprocess:
the COVERAGE_PROCESS_* variables start it there). A Prefect server would be traced for nothing: measured, its
start and 200 API calls cost 12.3 CPU-s traced against 8.5 untraced.
"""

from __future__ import annotations

COVERAGE_VARIABLES = ("COVERAGE_PROCESS_START", "COVERAGE_PROCESS_CONFIG")


def untraced(env: dict) -> dict:
    """`env` without the variables that start coverage in a Python child process."""
    return {k: v for k, v in env.items() if k not in COVERAGE_VARIABLES}
