"""Fixtures of the flow tests: the real digits demo set, once per session."""

from __future__ import annotations

import pytest

import modelkit as mk


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The real digits classifier, its FP32 references, INT8/FP16 candidates and labelled eval data."""
    mk.require_tflite_extra()    # the tflite extra builds the demo models
    from tiergate.demo.models import build_demo_set

    return build_demo_set(tmp_path_factory.mktemp("flows-demo"))
