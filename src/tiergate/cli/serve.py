"""`tiergate serve`: serve the revalidate (event-triggered), gate and drift-report flows on a Prefect server.

Needs a Prefect API (PREFECT_API_URL, e.g. from `prefect server start`). Runs until
stopped. See docs/prefect.md.
"""

from __future__ import annotations

from pathlib import Path

import typer

from tiergate.errors import EnvironmentProblem, InputError


_TARGETS_HELP = ("Device classes (comma-separated); each artifact runs on those of its format. "
                 "Default: every non-GPU class.")
_REMOTE_HELP = "DEVICE_CLASS=WORK_POOL: run that class on a worker of the pool (repeat for more)."


def serve_command(
    data: Path = typer.Option(..., "--data", "-d", help="Evaluation .npz used to revalidate registered artifacts."),
    targets: str | None = typer.Option(None, "--targets", "-t", help=_TARGETS_HELP),
    policy: Path | None = typer.Option(None, "--policy", help="Policy TOML (defaults: docs/policy.md)."),
    registry_url: str | None = typer.Option(None, "--registry", envvar="TIERGATE_REGISTRY_URL",
                                            help="Registry URL (default: sqlite under $TIERGATE_HOME)."),
    store: str | None = typer.Option(None, "--store",
                                     help="Artifact store (default: $TIERGATE_STORE or $TIERGATE_HOME/store)."),
    report_dir: Path | None = typer.Option(None, "--report-dir",
                                           help="Where revalidation reports go (one folder per artifact)."),
    remote: list[str] = typer.Option([], "--remote", help=_REMOTE_HELP),
    drift_out: Path | None = typer.Option(None, "--drift-out",
                                          help="Drift report folder (default: $TIERGATE_HOME/drift)."),
    drift_cron: str = typer.Option("0 6 * * *", "--drift-cron", help="Cron schedule of the drift report."),
    drift_every: int | None = typer.Option(None, "--drift-every", min=60,
                                           help="Drift report every N seconds instead of the cron schedule."),
    limit: int = typer.Option(2, "--limit", min=1, help="Flow runs at a time in this process."),
) -> None:
    """Serve revalidate (on `tiergate.artifact.registered`), release gate and the scheduled drift report."""
    from tiergate.orchestration.events import prefect_api_url

    if not prefect_api_url():
        raise EnvironmentProblem("no Prefect API to serve on",
                                 hint="start `prefect server start` and set PREFECT_API_URL")
    settings = _settings(data, targets, policy, registry_url, store, report_dir, remote, drift_out, drift_cron,
                         drift_every)
    _serve(settings, limit)


def _settings(data, targets, policy, registry_url, store, report_dir, remote, drift_out, drift_cron,
              drift_every):
    from tiergate.orchestration.deployments import ServeSettings
    from tiergate.paths import home
    from tiergate.policy import load_policy
    from tiergate.registry import default_url
    from tiergate.registry.store import default_location
    from tiergate.targets import resolve

    if not data.is_file():
        raise InputError(f"{data}: evaluation data does not exist")
    known = {dc.name for dc in resolve(targets)} if targets else None
    pools = dict(_pair(item) for item in remote)
    for name in pools:
        resolve([name])
        if known is not None and name not in known:
            raise InputError(f"--remote {name}: not among --targets ({', '.join(sorted(known))})")
    load_policy(policy)
    if drift_out is not None and drift_out.resolve() == (home() / "drift").resolve():
        drift_out = None            # the default itself, named: tiergate's own folder in the home, not a user's
    folders = [(option, path) for option, path in (("--report-dir", report_dir), ("--drift-out", drift_out)) if path]
    if folders:
        from tiergate.paths import check_outputs

        check_outputs([], [], folders=folders)
    return ServeSettings(data=str(data.resolve()), registry_url=registry_url or default_url(),
                         store=store or str(Path(default_location()).resolve()), targets=targets,
                         policy=str(policy.resolve()) if policy else None,
                         report_dir=str(report_dir.resolve()) if report_dir else None, remote=pools,
                         drift_out=str((drift_out or home() / "drift").resolve()), drift_cron=drift_cron,
                         drift_every_s=drift_every)


def _pair(item: str) -> tuple[str, str]:
    name, sep, pool = item.partition("=")
    if not sep or not name.strip() or not pool.strip():
        raise InputError(f"--remote {item!r}: expected DEVICE_CLASS=WORK_POOL")
    return name.strip(), pool.strip()


def _serve(settings, limit: int) -> None:
    from tiergate.orchestration.deployments import serve_all

    serve_all(settings, limit, typer.echo)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
