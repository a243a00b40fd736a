"""Coverage of the accuracy ratio's 95% interval: the score interval the gate uses now beside the paired
bootstrap it used before, at n = 100, 300, 1,000 and discordance rates 0-5%.

    .venv/bin/python bench/bench_paired_intervals.py [--draws 400] [--resamples 1999] [--p-ref 0.9]

For each configuration (tests/gate/coverage_kit.py: n samples, the reference right with probability p_ref,
a discordance rate of which a share favours the candidate) it prints the exact coverage of the score
interval (every count enumerated with its probability), its coverage over --draws simulated data sets, and
the bootstrap's (stats.metric_ratio on the hits, BCa, --resamples resamples, the exact zero-event bound when
nothing differs) over the same data sets, with its standard error. A measurement: never fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gate"))

from coverage_kit import Config, bootstrap_coverage, exact_coverage, grid, simulated_coverage  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draws", type=int, default=400)
    p.add_argument("--resamples", type=int, default=1999)
    p.add_argument("--p-ref", type=float, default=0.9)
    args = p.parse_args(argv)
    print(f"reference accuracy {args.p_ref}; bootstrap: {args.draws} data sets, {args.resamples} resamples each")
    print(f"{'n':>5} {'rate':>6} {'share':>5} {'ratio':>7} | {'score exact':>11} {'score sim':>9} | "
          f"{'bootstrap sim':>13} {'se':>5}")
    worst_score, worst_boot, started = 1.0, 1.0, time.monotonic()
    for config in grid(args.p_ref):
        exact = exact_coverage(config)
        simulated = simulated_coverage(config, args.draws, seed=config.n)
        boot = bootstrap_coverage(config, args.draws, seed=config.n, n_resamples=args.resamples)
        se = (boot * (1 - boot) / args.draws) ** 0.5
        worst_score, worst_boot = min(worst_score, exact), min(worst_boot, boot)
        print(f"{config.n:>5} {config.rate:>6.3f} {config.share:>5.2f} {config.truth('ratio'):>7.4f} | "
              f"{exact:>11.4f} {simulated:>9.4f} | {boot:>13.3f} {se:>5.3f}", flush=True)
    print(f"lowest coverage: score interval {worst_score:.4f} (exact), bootstrap {worst_boot:.3f} (simulated); "
          f"{time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Config", "main"]
