"""Registry test plumbing: a private registry and store per test, on SQLite + a folder and on a real
PostgreSQL server + a local S3 endpoint (tests/registry/backends.py): the same suite runs on both."""

from __future__ import annotations

import pytest

from backends import BACKENDS, open_registry, postgres_server, s3_server  # noqa: F401 - fixtures
from tiergate.registry import Registry


@pytest.fixture(params=BACKENDS)
def registry(request, tmp_path) -> Registry:
    with open_registry(request, request.param, tmp_path) as reg:
        yield reg
