import sys

import pytest

from tiergate.demo.models import build_demo_set
from tiergate.demo.train import import_tensorflow
from tiergate.errors import EnvironmentProblem, InputError


def test_out_dir_that_is_a_file_is_one_clear_input_error(tmp_path):
    target = tmp_path / "not-a-dir"
    target.write_text("x")
    with pytest.raises(InputError, match="not-a-dir: not a directory"):
        build_demo_set(target)


def test_missing_tensorflow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)    # what an install without the extra looks like
    with pytest.raises(EnvironmentProblem) as info:
        import_tensorflow()
    assert "tiergate[tflite]" in info.value.one_line()
