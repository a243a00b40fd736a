"""Entry point of the `tiergate` command.

Each command group lives in its own module with a `register(app)` function;
this module only assembles them and turns errors into one line and an exit
code (0 pass, 1 gate rejected or lint errors, 2 unusable input or environment,
3 gate inconclusive).
"""

from __future__ import annotations

import os
import sys

from tiergate.errors import EXIT_UNUSABLE, Interrupted, TiergateError, disk_full, is_disk_full

_COMMAND_MODULES = ("doctor", "intake", "gate", "explain", "bisect", "registry", "demo", "serve", "gc", "attest")
_APP = None


def _make_app():
    """The typer app (made on first use: an unchanged `tiergate gate` is answered without typer)."""
    global _APP
    if _APP is None:
        import typer

        _APP = typer.Typer(
            name="tiergate",
            help="Edge deployment revalidation: fingerprint, lint, run on every device tier, compare, gate.\n\n"
            "Exit codes: 0 pass, 1 gate rejected, lint errors or an attestation refused (verify), 2 unusable input or "
            "environment, "
            "3 gate inconclusive (collect more samples, or set on_inconclusive in the policy).",
            no_args_is_help=True,
            add_completion=False,
            pretty_exceptions_enable=False,
            rich_markup_mode=None,
        )
    return _APP


def __getattr__(name: str):
    if name == "app":
        return _make_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_REGISTERED = False


def _register_all() -> None:
    """Every command module's commands on the app, once per process (main() called again in one process, as the
    tests do, would otherwise add them again each time and typer would build every duplicate)."""
    global _REGISTERED
    if _REGISTERED:
        return
    import importlib

    app = _make_app()
    for name in _COMMAND_MODULES:
        importlib.import_module(f"tiergate.cli.{name}").register(app)
    _REGISTERED = True


def _click_errors():
    """(usage errors, click errors, aborts, exits): click's and typer's own copy of them."""
    import click

    try:  # typer 0.25+ runs on its own copy of click: its errors are not click's
        from typer._click import exceptions as typer_click
    except ImportError:  # pragma: no cover - older typer uses click itself
        typer_click = click.exceptions
    return ((click.UsageError, typer_click.UsageError), (click.ClickException, typer_click.ClickException),
            (click.exceptions.Abort, getattr(typer_click, "Abort", click.exceptions.Abort)),
            (click.exceptions.Exit, getattr(typer_click, "Exit", click.exceptions.Exit)))


def _fail(message: str, code: int = EXIT_UNUSABLE) -> int:
    print(f"tiergate: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (never raises for user errors)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        return _run(args)
    except TiergateError as exc:
        return _fail(exc.one_line(), exc.exit_code)
    except Interrupted as exc:
        return _fail(interrupted_line(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except OSError as exc:                     # the machine, not the model: never exit 1 (REJECT's code)
        if os.environ.get("TIERGATE_DEBUG"):
            raise
        if is_disk_full(exc):
            return _fail(disk_full(exc).one_line(), EXIT_UNUSABLE)
        return _fail(os_error_line(exc), EXIT_UNUSABLE)
    except _ClickError as exc:                 # click's exceptions (typer is imported by then)
        return _click_exit(exc.error)
    except Exception as exc:  # an internal bug: still one line unless debugging
        if os.environ.get("TIERGATE_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set TIERGATE_DEBUG=1 for the traceback)")


class _ClickError(Exception):
    """A click exception carried out of _run (so that click is never imported on the fast path)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def os_error_line(exc: OSError) -> str:
    """An operating-system error as one line: what failed, on which file."""
    where = f"{exc.filename}: " if exc.filename else ""
    if getattr(exc, "filename2", None):
        where = f"{exc.filename} -> {exc.filename2}: "
    return f"{where}{exc.strerror or type(exc).__name__ + ': ' + str(exc)}"


# the commands that keep state in the home: it is checked before they start (paths.check_home)
_HOME_COMMANDS = ("gate", "explain", "gc", "demo", "register", "report", "serve")


def _run(args: list[str]) -> int:
    if args[:1] and args[0] in _HOME_COMMANDS and not {"--help", "-h"} & set(args):
        from tiergate.paths import home

        home()
    if args[:1] == ["gate"]:     # an unchanged re-run: answered before typer is imported (cli/fastgate.py)
        from tiergate.cli.fastgate import answer

        code = answer(args[1:])
        if code is not None:
            return code
    import typer

    _register_all()
    command = typer.main.get_command(_make_app())
    click_types = sum(_click_errors(), ())
    try:
        result = command.main(args=args, prog_name="tiergate", standalone_mode=False)
    except click_types as exc:
        raise _ClickError(exc) from None
    return result if isinstance(result, int) else 0


def _click_exit(exc: BaseException) -> int:
    """The exit code (and one line) of a click usage error, other click error, abort or exit."""
    usage_errors, click_errors, aborts, exits = _click_errors()
    if isinstance(exc, exits):
        return exc.exit_code
    if isinstance(exc, usage_errors):
        usage = exc.ctx.get_usage() if exc.ctx is not None else "Usage: tiergate [OPTIONS] COMMAND [ARGS]..."
        print(usage.splitlines()[0] if usage else "", file=sys.stderr)
        return _fail(exc.format_message(), EXIT_UNUSABLE)
    if isinstance(exc, click_errors):
        return _fail(exc.format_message(), EXIT_UNUSABLE)
    return _fail("aborted", 130)


def interrupted_line(exc: Interrupted) -> str:
    from tiergate.execution import janitor
    from tiergate.paths import home_path

    removed = exc.removed or "nothing was running"
    return (f"interrupted by {exc.signame}: stopped; {removed}; kept {janitor.finished()} finished run(s) "
            f"under {home_path() / 'runs'}")


def run() -> None:
    code = main()
    if code in (130, 143):
        # Interrupted: what ran is removed and what finished is kept; a worker still inside a
        # build or a lock must not hold the exit (the interpreter would join it).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    exit_now(code)


def exit_now(code: int) -> None:
    """sys.exit(code) without the interpreter's teardown (freeing every module: 0.2 s after a gate, whose
    user waits for the exit): once no thread but this one runs, the output is flushed and the exit handlers
    (atexit: leases, temporary folders, logging) have run, nothing is left for the teardown to do. Where
    another thread still runs, or the output cannot be flushed (a closed pipe), the plain exit."""
    import atexit
    import threading

    if threading.active_count() > 1:
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


if __name__ == "__main__":
    run()
