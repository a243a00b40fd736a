"""The harness's own overhead: its timed loop against a bare loop, in the same process.

Imported by tiergate_harness.py only for --compare-rounds N (bench/bench_harness.py).
After warm-up it alternates N rounds of the harness's timed loop and of the loop a
user would write by hand (a plain `session.run` / `invoke` loop, timed per call
with the same clock and as a whole loop), and records each round's medians in
result.json's extra.compare.
"""

from __future__ import annotations

import time


class CompareHook:
    def __init__(self, rounds):
        self.rounds = rounds

    def before_timed_loop(self, runner, feeds, store):
        runner.extra["compare"] = [compare_round(runner, feeds, store) for _ in range(self.rounds)]


def hook(rounds):
    return CompareHook(rounds)


def compare_round(runner, feeds, store):
    harness = runner.timed_loop(feeds, store)
    bare, whole = bare_loop(runner, feeds)
    return {"harness_median_ns": median(harness), "bare_median_ns": median(bare), "bare_loop_ns_per_call": whole}


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def bare_loop(runner, feeds):
    """A plain `session.run` (onnxruntime) or set_tensor + `invoke` (LiteRT) loop: per-call and whole-loop times."""
    clock, lat = time.monotonic_ns, []
    if hasattr(runner, "session"):
        session, names = runner.session, runner.output_names
        start = clock()
        for feed in feeds:
            t0 = clock()
            session.run(names, feed)
            lat.append(clock() - t0)
    else:
        interp = runner.interp
        start = clock()
        for feed in feeds:
            for index, value in feed:
                interp.set_tensor(index, value)
            t0 = clock()
            interp.invoke()
            lat.append(clock() - t0)
    return lat, (clock() - start) / len(feeds)
