"""The CLI's exit (tiergate.cli.main.exit_now): the code, the output and the exit handlers as sys.exit gives
them, without the interpreter's teardown; with another thread still running, the plain exit (which joins it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    from pathlib import Path
    from tiergate.cli.main import exit_now

    out = Path(sys.argv[1])
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    sys.stdout.write("buffered, no newline")          # flushed by exit_now, never lost
    sys.stderr.write("and on stderr")
    if sys.argv[2] == "thread":                       # still running at the exit: the interpreter joins it
        threading.Thread(target=lambda: (time.sleep(0.3), (out / "thread").write_text("done"))).start()
    exit_now(int(sys.argv[3]))
""")


def _run(tmp_path: Path, mode: str, code: int) -> subprocess.CompletedProcess:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    return subprocess.run([sys.executable, str(script), str(tmp_path), mode, str(code)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_exit_now_keeps_code_output_and_exit_handlers(tmp_path):
    for code in (0, 1, 3):
        (tmp_path / "atexit").unlink(missing_ok=True)
        done = _run(tmp_path, "alone", code)
        assert done.returncode == code
        assert done.stdout == "buffered, no newline" and done.stderr == "and on stderr"
        assert (tmp_path / "atexit").read_text() == "ran"


def test_exit_now_with_a_running_thread_is_the_plain_exit(tmp_path):
    done = _run(tmp_path, "thread", 1)
    assert done.returncode == 1 and done.stdout == "buffered, no newline"
    assert (tmp_path / "thread").read_text() == "done"      # joined, not killed
    assert (tmp_path / "atexit").read_text() == "ran"


def test_exit_now_into_a_closed_pipe_still_exits_with_the_code(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), "alone", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    proc.stdout.close()                               # nobody reads: the flush fails, the exit code stays
    assert proc.wait(timeout=60) == 1
    assert (tmp_path / "atexit").read_text() == "ran"
