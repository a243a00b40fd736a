"""Keep TensorFlow's and the quantizers' chatter off the terminal while a set is built.

TensorFlow's native code writes straight to file descriptors 1 and 2 (absl logs,
converter summaries), and onnxruntime's calibrator prints progress; none of it
helps a user of `tiergate demo`. The output is kept in a temporary file and
replayed on stderr only if the build fails.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def captured_output() -> Iterator[None]:
    """Send fd 1/2 and sys.stdout/stderr to a scratch file; replay it on stderr if the block raises."""
    with tempfile.TemporaryFile() as sink:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved = (os.dup(1), os.dup(2))
        text = io.TextIOWrapper(os.fdopen(os.dup(sink.fileno()), "wb"), write_through=True)
        failed = False
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield
        except BaseException:
            failed = True
            raise
        finally:
            text.close()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            if failed:
                sink.seek(0)
                sys.stderr.write(sink.read().decode(errors="replace"))
