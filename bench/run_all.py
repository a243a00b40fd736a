"""Run every benchmark in bench/, one after the other, each printing its own side-by-side ratios.

    .venv/bin/python bench/run_all.py [NAME ...]     # e.g. pipeline harness; default: all

Benchmarks are measurements, not tests: they print figures and never fail on a threshold.
bench_pipeline's cold step removes tiergate's built images (not the base images) first.
bench_gate_paddleocr fetches its model from a pinned wheel once (the tests' cache) and takes a few minutes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("fingerprint", "onnx_corpus", "paired_intervals", "harness", "rebuild", "parallel", "pipeline",
         "gate_paddleocr", "cpu_tiers", "counting", "insn_vs_time")


def main(names: list[str]) -> int:
    failed = []
    for name in names or ORDER:
        script = HERE / f"bench_{name}.py"
        if not script.is_file():
            print(f"no benchmark {name!r} (have: {', '.join(ORDER)})", file=sys.stderr)
            return 2
        print(f"\n=== bench_{name} ===", flush=True)
        started = time.monotonic()
        if subprocess.run([sys.executable, str(script)]).returncode != 0:
            failed.append(name)
        print(f"--- bench_{name}: {time.monotonic() - started:.0f} s", flush=True)
    if failed:
        print(f"benchmarks that did not finish: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
