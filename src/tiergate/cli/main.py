"""Entry point of the `tiergate` command.

Each command group lives in its own module with a `register(app)` function;
this module only assembles them and turns errors into one line and an exit
code (0 pass, 1 gate rejected or lint errors, 2 unusable input or environment).
"""

from __future__ import annotations

import os
import sys

import click
import typer

try:   # typer >= 0.22 raises the exceptions of the click it vendors (typer._click), not click's own
    from typer._click import exceptions as _vendored
except ImportError:  # pragma: no cover - older typer uses click itself
    _vendored = click.exceptions
_EXIT = (click.exceptions.Exit, getattr(_vendored, "Exit", click.exceptions.Exit))
_CLICK_ERRORS = (click.ClickException, _vendored.ClickException)
_ABORT = (click.exceptions.Abort, getattr(_vendored, "Abort", click.exceptions.Abort))

from tiergate.errors import EXIT_UNUSABLE, TiergateError

app = typer.Typer(
    name="tiergate",
    help="Edge deployment revalidation: fingerprint, lint, run on every device tier, compare, gate.\n\n"
    "Exit codes: 0 pass, 1 gate rejected or lint errors, 2 unusable input or environment.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_COMMAND_MODULES = ("doctor", "intake", "gate", "explain", "registry", "demo", "serve")


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
    except _EXIT as exc:
        return exc.exit_code
    except _CLICK_ERRORS as exc:       # usage errors: the message and the usage hint, exit 2
        return _fail(exc.format_message(), EXIT_UNUSABLE)
    except _ABORT:
        return _fail("aborted", 130)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # an internal bug: still one line unless debugging
        if os.environ.get("TIERGATE_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set TIERGATE_DEBUG=1 for the traceback)")
    return result if isinstance(result, int) else 0


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
