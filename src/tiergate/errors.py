"""Errors a user can cause, each with the exit code the CLI documents.

Exit codes: 0 pass, 1 gate rejected or lint errors, 2 unusable input or environment,
3 gate inconclusive (a task metric's confidence interval straddles its threshold).
Raise these from anywhere in the package; the CLI turns them into one line on
stderr and the exit code, never a traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_UNUSABLE = 2
EXIT_INCONCLUSIVE = 3


class TiergateError(Exception):
    """Base of every error the CLI reports as one line (exit 2)."""

    exit_code = EXIT_UNUSABLE

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = " ".join(self.message.split())
        return f"{text} (hint: {self.hint})" if self.hint else text


class InputError(TiergateError):
    """The user gave something unusable: a bad model, data file, policy, name."""


class EnvironmentProblem(TiergateError):
    """The machine cannot do the job: no Docker engine, no emulation, no GPU."""


class InfrastructureFault(EnvironmentProblem):
    """A transient fault outside the model (engine unreachable): worth a bounded retry."""
