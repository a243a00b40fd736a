from __future__ import annotations

from pathlib import Path

import pytest

import modelkit as mk


@pytest.fixture(scope="session")
def demo_set(tmp_path_factory):
    """The real digits classifier and its candidates (built once per test session)."""
    mk.require_tflite_extra()    # the tflite extra builds the demo models
    from tiergate.demo.models import build_demo_set

    return build_demo_set(tmp_path_factory.mktemp("demo-models"))


@pytest.fixture(scope="session")
def shared_home(tmp_path_factory) -> Path:
    """One TIERGATE_HOME for the module's gate runs, so reference runs are cached between tests."""
    return tmp_path_factory.mktemp("tiergate-home")


@pytest.fixture(scope="session")
def larger_eval(demo_set, tmp_path_factory) -> Path:
    """2,000 evaluation samples (the 450 test images, then jittered copies): enough for the entropy-calibrated
    INT8 candidate's accuracy-ratio interval to clear 0.99 (on the 450 alone it is INCONCLUSIVE)."""
    from tiergate.demo.models import make_eval_npz

    return make_eval_npz(tmp_path_factory.mktemp("eval") / "digits-eval-2000.npz", 2000)
