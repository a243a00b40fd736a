"""`tiergate doctor`: can this machine run the pipeline?"""

from __future__ import annotations

import json

import typer
from rich.console import Console

from tiergate.cli import screen
from rich.table import Table

from tiergate.errors import EXIT_OK, EXIT_UNUSABLE

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def doctor(as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON.")) -> None:
    """Check each prerequisite; exit 0 when the pipeline can run here, 2 when not."""
    from tiergate.doctor import run_checks

    checks = run_checks()
    code = EXIT_UNUSABLE if any(c.failed for c in checks) else EXIT_OK
    if as_json:
        typer.echo(json.dumps({"ok": code == EXIT_OK, "checks": [c.__dict__ for c in checks]}, indent=1))
        raise typer.Exit(code)
    table = Table(title="tiergate doctor")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for c in checks:
        table.add_row(c.name, f"[{_STYLE[c.status]}]{c.status}[/]", c.detail, c.fix)
    console = screen.console(120)
    console.print(table)
    failed = [c for c in checks if c.failed]
    if failed:
        Console(stderr=True).print(f"tiergate: not ready: {failed[0].name}: {failed[0].detail}; fix: {failed[0].fix}",
                                   highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
