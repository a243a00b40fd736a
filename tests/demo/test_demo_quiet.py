import os
import sys

import pytest

from tiergate.demo.quiet import captured_output


def _chatter(tag: str) -> None:
    os.write(1, f"native-out-{tag}\n".encode())
    os.write(2, f"native-err-{tag}\n".encode())
    print(f"py-out-{tag}")
    print(f"py-err-{tag}", file=sys.stderr)


def test_output_inside_is_held_back_and_output_after_is_not(capfd):
    with captured_output():
        _chatter("inside")
    _chatter("after")
    out, err = capfd.readouterr()
    assert "inside" not in out + err
    assert "native-out-after" in out and "py-out-after" in out and "native-err-after" in err


def test_output_is_replayed_on_stderr_when_the_block_fails(capfd):
    with pytest.raises(RuntimeError, match="boom"):
        with captured_output():
            _chatter("failing")
            raise RuntimeError("boom")
    out, err = capfd.readouterr()
    for text in ("native-out-failing", "native-err-failing", "py-out-failing", "py-err-failing"):
        assert text in err
    _chatter("later")
    out, err = capfd.readouterr()
    assert "native-out-later" in out and "native-err-later" in err
