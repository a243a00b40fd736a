from __future__ import annotations

import pytest

import mlflowkit


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory):
    """One real MLflow store (SQLite, local artifact root) for tests/mlflow: (client, experiment id, tracking URI).
    Each test module registers models under names of its own."""
    folder = tmp_path_factory.mktemp("mlflow-store")
    with mlflowkit.store(folder) as (client, experiment):
        yield client, experiment, f"sqlite:///{folder / 'mlflow.db'}"


@pytest.fixture(scope="session")
def mlflow_empty_store(mlflow_store):
    """A migrated, empty MLflow SQLite file to copy: a module that needs stores of its own skips the 8 s of
    creating each."""
    from pathlib import Path

    return Path(mlflow_store[2].removeprefix("sqlite:///")).parent / mlflowkit.EMPTY
