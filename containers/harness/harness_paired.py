"""--pair-model P [--pair-model P2] --pairs K (tiergate_harness.py): the artifact's calls interleaved with its
partners'.

Imported only when --pair-model is given (native classes: the candidate's run pairs with the FP32 reference,
and with the incumbent when there is one). After the artifact's own run (its result and memory figures
written), every model is loaded in this process, warmed up, and called in turn on the same feed, round after
round; round i starts at model i mod M (M models), so that none always runs first or second (caches warmed by
another, a frequency step). A machine that slows down for a while slows every call of a round: the per-round
ratio is what stays trustworthy on a noisy host, where separate loops' means are not. At most K rounds, and
no more than --pairs-seconds of calls (whole cycles of M rounds).

A partner that does not answer (a call that never returns) cannot hold the run: a watchdog thread
(the runtimes release the GIL while they compute) ends the process once loading and warming the partners
take over max(MIN_LIMIT_S, LIMIT_FACTOR x the artifact's own load and first call), or the rounds over
--pairs-seconds plus that; `on_timeout` first records why. The artifact's own result is already written.

Returns what the harness writes into result.json's extra.paired: latencies_ns (the artifact's) and, per
partner, its latencies_ns, one per round, in order.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

MIN_LIMIT_S = 10.0     # the least a phase may take before the watchdog ends it
LIMIT_FACTOR = 10      # ... or this many times the artifact's own load and first call


class Watchdog:
    def __init__(self, on_timeout):
        self.on_timeout, self.timer = on_timeout, None

    def arm(self, seconds, what):
        self.cancel()

        def fire():
            self.on_timeout(f"{what} took over {seconds:.0f} s (a partner call that does not return?)")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)                  # the run's result stands; the pairing says why it has no pairs

        self.timer = threading.Timer(seconds, fire)
        self.timer.daemon = True
        self.timer.start()

    def cancel(self):
        if self.timer is not None:
            self.timer.cancel()


def measure(args, loaded, make_runner, slices, own_seconds, on_timeout) -> dict:
    """`own_seconds`: the artifact's own load and first call (the watchdog's scale); `on_timeout(why)`: records
    why before the watchdog ends the process."""
    watchdog = Watchdog(on_timeout)
    limit = max(MIN_LIMIT_S, LIMIT_FACTOR * own_seconds)
    watchdog.arm(limit, "loading and warming the partner")
    try:
        return _measure(args, loaded, make_runner, slices, watchdog, limit)
    finally:
        watchdog.cancel()


def _measure(args, loaded, make_runner, slices, watchdog, limit) -> dict:
    data, n, axes = loaded
    # the partners run as the tier runs them: the candidate's passes switched off (--disabled) are its own
    runners = [make_runner(args)] + [make_runner(argparse.Namespace(**{**vars(args), "model": model,
                                                                        "disabled_passes": []}))
                                     for model in args.pair_model]
    batch = runners[0].batch_size(args.batch_size, axes["inputs"])
    if any(r.batch_size(args.batch_size, axes["inputs"]) != batch for r in runners[1:]):
        raise SystemExit("harness: the paired models take different batch sizes")
    spans = slices(min(n, max(1, args.pairs) * batch), batch)
    feeds = [[r.prepare(data, a, b, axes["inputs"]) for r in runners] for a, b in spans]
    for _ in range(max(1, args.warmup)):
        for runner, feed in zip(runners, feeds[0]):
            runner.infer(feed)
    watchdog.arm(args.pairs_seconds + limit, "the interleaved calls")
    clock = time.monotonic_ns
    deadline = clock() + int(args.pairs_seconds * 1e9)
    times = [[] for _ in runners]
    m = len(runners)
    for i in range(args.pairs):
        round_feeds = feeds[i % len(feeds)]
        for k in range(m):
            j = (i + k) % m                            # round i starts at model i mod m
            t0 = clock()
            runners[j].infer(round_feeds[j])
            times[j].append(clock() - t0)
        if (i + 1) % m == 0 and clock() > deadline:
            break
    return {"pairs": len(times[0]), "asked": args.pairs, "batch_size": batch, "feeds": len(feeds),
            "order": "rotating: round i starts at model i mod M (the artifact first in round 0)",
            "latencies_ns": times[0],
            "partners": [{"model": model, "latencies_ns": t} for model, t in zip(args.pair_model, times[1:])]}
