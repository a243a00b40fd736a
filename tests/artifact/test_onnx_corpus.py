"""`tiergate inspect` over every ONNX node test case generated from the installed onnx wheel and every model
the wheel ships (about 2,000 models no one here wrote), judged against onnxruntime itself: no internal error,
no model onnxruntime refuses passes, no error finding on a model it loads."""

from __future__ import annotations

import pytest

from .onnx_corpus import judge, write_corpus


@pytest.mark.slow
def test_inspect_over_onnx_backend_test_models(tmp_path):
    paths = write_corpus(tmp_path / "corpus")
    assert len(paths) >= 1800
    found = judge(paths)
    print(found.line())
    assert found.internal == []
    assert found.refused_but_ok == []
    assert found.loads_but_error == []
    assert found.refused > 100 and found.loads > 1000             # both kinds are really there
    assert found.total == len(paths) == found.loads + found.refused
