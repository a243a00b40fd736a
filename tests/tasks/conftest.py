"""The task tests (issue 41): real models of the tasks edge teams ship, fetched from their pinned wheels as
tests/realmodels does (realmodels.conftest.fetch: a skip without the package index, a failure under CI)."""

from __future__ import annotations

import os

import pytest

from realmodels.conftest import fetch


@pytest.fixture(scope="session")
def real_model():
    return fetch


@pytest.fixture(scope="module")
def task_home(tmp_path_factory):
    """One TIERGATE_HOME for a module: its reference's runs are made once and reused by each candidate's gate."""
    home = tmp_path_factory.mktemp("tiergate-tasks-home")
    saved = os.environ.get("TIERGATE_HOME")
    os.environ["TIERGATE_HOME"] = str(home)
    yield home
    if saved is None:
        os.environ.pop("TIERGATE_HOME", None)
    else:
        os.environ["TIERGATE_HOME"] = saved
