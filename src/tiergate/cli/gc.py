"""`tiergate gc`: remove images, run folders and cached decisions nothing needs (docs/gc.md)."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import typer

from tiergate.errors import EXIT_OK, EXIT_UNUSABLE, InputError, TiergateError

_REGISTRY_HELP = ("SQLAlchemy URL of the registry whose aliases and artifacts gc keeps (default: "
                  "$TIERGATE_REGISTRY_URL or sqlite:///$TIERGATE_HOME/registry.db when that file exists).")


def open_registry(url: str | None):
    """The registry to read, or None when there is none (the default SQLite file does not exist).

    A registry named explicitly (--registry, TIERGATE_REGISTRY_URL) must exist: an empty one
    made by a typo would make every promoted alias look unneeded.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from tiergate.registry import URL_ENV, Registry, default_url
    from tiergate.registry.masking import masked

    explicit = url or os.environ.get(URL_ENV)
    url = explicit or default_url()
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InputError(f"registry URL {masked(url)!r} is not a SQLAlchemy URL (e.g. sqlite:///path/registry.db)") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") \
            and not Path(parsed.database).is_file():
        if explicit:
            raise InputError(f"registry {masked(url)}: no such database file; gc needs the registry that holds your aliases")
        return None
    return Registry(url)


def gc_command(
    dry_run: bool = typer.Option(False, "--dry-run", help="List what would be removed, with sizes; remove nothing."),
    older_than: str | None = typer.Option(None, "--older-than",
                                          help="Only remove what is older than this: 30d, 12h, 90m, 2w."),
    keep_last: int = typer.Option(3, "--keep-last", help="Keep the last N registered artifacts of each model "
                                  "(and the last N decisions of each unregistered candidate)."),
    registry_url: str | None = typer.Option(None, "--registry", help=_REGISTRY_HELP),
    runtime_images: bool = typer.Option(False, "--runtime-images",
                                        help="Also remove runtime images no remaining artifact image is built on."),
    all_images: bool = typer.Option(False, "--all-images", help="Consider every tiergate artifact image on the "
                                    "engine, not only those this TIERGATE_HOME's runs used (single-user engines)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan (and what was removed) as JSON."),
) -> None:
    """Remove images, run folders and cached decisions that no alias, pending gate or recent artifact needs."""
    from tiergate import gc, leases
    from tiergate.paths import home

    if keep_last < 0:
        raise InputError(f"--keep-last {keep_last}: must be 0 or more")
    age = gc.parse_duration(older_than) if older_than else None
    root = home()
    registry = open_registry(registry_url)
    try:
        needs = gc.registry_needs(registry, keep_last) if registry is not None else gc.Needs()
    finally:
        if registry is not None:
            registry.close()
    engine, inventory, engine_problem = None, None, leases.problem()
    # no gate takes an image up between reading the leases and removing (a dry run removes nothing); a lease folder
    # that is not trusted (leases.check_folder) says nothing of the gates running: no image is removed then
    with leases.excluding_gates() if not dry_run and engine_problem is None else nullcontext():
        try:
            if engine_problem is None:
                engine = gc.DockerEngine()
                inventory = engine.inventory()
        except TiergateError as exc:
            engine_problem = exc.one_line()
        except Exception as exc:  # noqa: BLE001 - an engine that fails mid-listing is the same problem
            engine_problem = f"Docker engine: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        plan = gc.plan(root, needs, inventory, keep_last=keep_last, older_than=age, runtime_images=runtime_images,
                       all_images=all_images, leased=leases.leased(prune=not dry_run))
        if engine_problem:
            plan.skipped.append(f"{engine_problem}: images, containers and volumes were skipped")
        if not dry_run:
            gc.apply(plan, root, engine if inventory is not None else None)
    if as_json:
        typer.echo(json.dumps(_json(plan, root, dry_run, registry), indent=1))
    else:
        _print(plan, dry_run)
    for item in plan.errors:
        print(f"tiergate: warning: could not remove {item.kind} {item.name}: {item.error}", file=sys.stderr)
    if engine_problem:
        done = "were listed" if dry_run else "were cleaned"
        print(f"tiergate: error: {engine_problem}; images, containers and volumes were skipped "
              f"(run folders and decisions {done})", file=sys.stderr)
        raise typer.Exit(EXIT_UNUSABLE)
    raise typer.Exit(EXIT_OK)


def _totals(items) -> dict:
    size = sum(i.size for i in items)
    from tiergate.gc import human_size

    return {"count": len(items), "bytes": size, "size": human_size(size),
            "by_kind": dict(sorted(Counter(i.kind for i in items).items()))}


def _json(plan, root: Path, dry_run: bool, registry) -> dict:
    removing = [i for i in plan.removals if dry_run or i.removed]
    return {"dry_run": dry_run, "home": str(root), "registry": repr(registry) if registry is not None else None,
            "removed" if not dry_run else "would_remove": _totals(removing), "kept": _totals(plan.kept),
            "skipped": plan.skipped, "errors": [f"{i.kind} {i.name}: {i.error}" for i in plan.errors],
            "items": [i.to_json() for i in plan.items]}


def _print(plan, dry_run: bool) -> None:
    from tiergate.gc import human_size

    verb = "would remove" if dry_run else "removed"
    shown = [i for i in plan.removals if dry_run or i.removed]
    if shown:
        width = min(60, max(len(i.name) for i in shown))
        for i in shown:
            typer.echo(f"{verb}  {i.kind:<9} {i.name:<{width}}  {human_size(i.size):>10}  {i.reason}")
    kept = Counter(i.kind for i in plan.kept)
    kept_text = ", ".join(f"{n} {k}{'s' if n != 1 else ''}" for k, n in sorted(kept.items())) or "nothing"
    typer.echo(f"{verb} {len(shown)} item(s), {human_size(sum(i.size for i in shown))}; kept {kept_text}"
               + (" (--json for every item and why)" if plan.kept else ""))


def register(app: typer.Typer) -> None:
    app.command("gc")(gc_command)

