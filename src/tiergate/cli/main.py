"""Entry point of the `tiergate` command.

Each command group lives in its own module with a `register(app)` function;
this module only assembles them and turns errors into one line and an exit
code (0 pass, 1 gate rejected or lint errors, 2 unusable input or environment,
3 gate inconclusive).
"""

from __future__ import annotations

import os
import sys

import click
import typer

from tiergate.errors import EXIT_UNUSABLE, Interrupted, TiergateError, disk_full, is_disk_full

try:  # typer 0.25+ runs on its own copy of click: its errors are not click's
    from typer._click import exceptions as _typer_click
except ImportError:  # pragma: no cover - older typer uses click itself
    _typer_click = click.exceptions
_USAGE_ERRORS = (click.UsageError, _typer_click.UsageError)
_CLICK_ERRORS = (click.ClickException, _typer_click.ClickException)
_ABORTS = (click.exceptions.Abort, getattr(_typer_click, "Abort", click.exceptions.Abort))
_EXITS = (click.exceptions.Exit, getattr(_typer_click, "Exit", click.exceptions.Exit))

app = typer.Typer(
    name="tiergate",
    help="Edge deployment revalidation: fingerprint, lint, run on every device tier, compare, gate.\n\n"
    "Exit codes: 0 pass, 1 gate rejected or lint errors, 2 unusable input or environment, "
    "3 gate inconclusive (collect more samples, or set on_inconclusive in the policy).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_COMMAND_MODULES = ("doctor", "intake", "gate", "explain", "registry", "demo", "serve", "gc")


def _register_all() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        importlib.import_module(f"tiergate.cli.{name}").register(app)


def _fail(message: str, code: int = EXIT_UNUSABLE) -> int:
    print(f"tiergate: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (never raises for user errors)."""
    _register_all()
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="tiergate", standalone_mode=False)
    except TiergateError as exc:
        return _fail(exc.one_line(), exc.exit_code)
    except Interrupted as exc:
        return _fail(interrupted_line(exc), exc.exit_code)
    except _EXITS as exc:
        return exc.exit_code
    except _USAGE_ERRORS as exc:
        usage = exc.ctx.get_usage() if exc.ctx is not None else "Usage: tiergate [OPTIONS] COMMAND [ARGS]..."
        print(usage.splitlines()[0] if usage else "", file=sys.stderr)
        return _fail(exc.format_message(), EXIT_UNUSABLE)
    except _CLICK_ERRORS as exc:
        return _fail(exc.format_message(), EXIT_UNUSABLE)
    except _ABORTS:
        return _fail("aborted", 130)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        return _fail(disk_full(exc).one_line(), EXIT_UNUSABLE)
    except Exception as exc:  # an internal bug: still one line unless debugging
        if os.environ.get("TIERGATE_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set TIERGATE_DEBUG=1 for the traceback)")
    return result if isinstance(result, int) else 0


def interrupted_line(exc: Interrupted) -> str:
    from tiergate.execution import janitor
    from tiergate.paths import home

    removed = exc.removed or "nothing was running"
    return (f"interrupted by {exc.signame}: stopped; {removed}; kept {janitor.finished()} finished run(s) "
            f"under {home() / 'runs'}")


def run() -> None:
    code = main()
    if code in (130, 143):
        # Interrupted: what ran is removed and what finished is kept; a worker still inside a
        # build or a lock must not hold the exit (the interpreter would join it).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
