"""A real MLflow tracking and registry store for tests: SQLite in a folder, a local artifact root."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path


EMPTY = "empty-mlflow.db"      # beside the session's store: a migrated store with nothing in it


@contextmanager
def store(folder: Path):
    """MLFLOW_TRACKING_URI set to a new SQLite store in `folder` (restored after); yields (client, experiment id)."""
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.environ.pop("MLFLOW_REGISTRY_URI", None)
    try:
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        client.search_experiments()                            # the tables made (about 8 s): once per session
        shutil.copyfile(folder / "mlflow.db", folder / EMPTY)  # an empty store other stores are copied from
        experiment = client.create_experiment("tiergate-tests", artifact_location=(folder / "artifacts").as_uri())
        yield client, experiment
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def log_version(client, experiment: str, name: str, *files: Path, alias: str | None = None) -> str:
    """A run that logs `files` under model/, registered as a new version of `name` (alias set); its version."""
    from mlflow.exceptions import MlflowException

    run = client.create_run(experiment)
    for f in files:
        client.log_artifact(run.info.run_id, str(f), "model")
    client.set_terminated(run.info.run_id)
    try:
        client.create_registered_model(name)
    except MlflowException:
        pass                                        # already there
    version = client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id)
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    return str(version.version)
