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

_COMMAND_MODULES = ("doctor", "intake", "gate", "registry", "demo", "serve", "gc")


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
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        return _fail(exc.format_message(), EXIT_UNUSABLE)
    except click.exceptions.Abort:
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
