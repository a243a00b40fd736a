"""The reports' one filled registry, shared by the drift-report and browser tests (read only)."""

from __future__ import annotations

import pytest
from report_kit import populate

from tiergate.registry import Registry


@pytest.fixture(scope="session")
def filled(tmp_path_factory):
    """One registry for the session, filled by real gates on x86_64 and emulated arm64 (report_kit.populate):
    (registry, what populate made). Tests read it; a test that writes makes its own registry."""
    tmp_path = tmp_path_factory.mktemp("filled")
    with Registry(f"sqlite:///{tmp_path / 'registry.db'}", tmp_path / "store") as registry:
        yield registry, populate(registry, tmp_path)
