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


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the gate: stop launching, remove what was started, keep what finished.

    A BaseException (like KeyboardInterrupt), so that no `except Exception` on the way
    turns it into a failed run or a verdict. Exit code 128 + the signal (130, 143).
    """

    def __init__(self, signum: int, removed: str = ""):
        import signal

        super().__init__(signum)
        self.signum = signum
        self.removed = removed
        self.exit_code = 128 + signum
        try:
            self.signame = signal.Signals(signum).name
        except ValueError:
            self.signame = f"signal {signum}"


def disk_full(exc: OSError, where: object = "") -> "EnvironmentProblem":
    """The one line for a full disk (ENOSPC) or an exceeded quota (EDQUOT)."""
    place = f" writing {where}" if where else (f" writing {exc.filename}" if exc.filename else "")
    return EnvironmentProblem(f"disk full{place}: {exc.strerror or exc}", hint="free some space and run it again")


def is_disk_full(exc: BaseException) -> bool:
    import errno

    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
