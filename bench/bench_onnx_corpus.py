"""`tiergate inspect` over ONNX's own backend test models, judged against onnxruntime itself.

    .venv/bin/python bench/bench_onnx_corpus.py [--keep DIR]

Generates every node test case from the installed onnx wheel (onnx.backend.test.case.node) and copies every
model the wheel ships, inspects each (load, fingerprint, lint with the host runtime's session check, a diff
against the model before it), and prints how many onnxruntime loads and refuses, and how many tiergate
crashed on, passed although onnxruntime refuses them, or flagged with an error although onnxruntime loads
them (tests/artifact/test_onnx_corpus.py asserts the last three are 0). A measurement: never fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "artifact"))

from onnx_corpus import judge, write_corpus  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", type=Path, help="write the corpus here (kept) instead of a temporary folder")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tiergate-onnx-corpus-") as tmp:
        folder = args.keep or Path(tmp)
        started = time.monotonic()
        paths = write_corpus(folder)
        written = time.monotonic() - started
        found = judge(paths)
        judged = time.monotonic() - started - written
    print(found.line())
    print(f"corpus written in {written:.1f} s, judged in {judged:.1f} s ({1000 * judged / max(found.total, 1):.1f} ms "
          "per model)")
    for title, items in (("internal errors", found.internal), ("unusable", found.unusable),
                         ("refused but ok", found.refused_but_ok), ("loadable with an error", found.loads_but_error)):
        for item in items[:20]:
            print(f"  {title}: {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
