"""Registry test plumbing: a private SQLite registry file and store folder per test."""

from __future__ import annotations

import pytest

from tiergate.registry import Registry


@pytest.fixture
def registry(tmp_path) -> Registry:
    with Registry(f"sqlite:///{tmp_path / 'reg' / 'registry.db'}", tmp_path / "store") as reg:
        yield reg
