"""--pair-model P --pairs K (tiergate_harness.py): the artifact's calls interleaved with a partner's.

Imported only when --pair-model is given (native classes: the candidate's run pairs with the FP32
reference). After the artifact's own run (its result and memory figures written), both models are
loaded in this process, warmed up, and called alternately on the same feeds: pair i times the artifact
then the partner when i is even, the partner then the artifact when odd, so that neither always runs
second (caches warmed by the other, a frequency step). A machine that slows down for a while slows both
calls of a pair: the per-pair ratio is what stays trustworthy on a noisy host, where two separate loops'
means are not. At most K pairs, and no more than --pairs-seconds of calls (whole AB/BA rounds).

A partner that does not answer (a call that never returns) cannot hold the run: a watchdog thread
(the runtimes release the GIL while they compute) ends the process once loading and warming the partner
take over `load_limit` seconds, or the pairs over --pairs-seconds plus `call_limit`; `on_timeout` first
records why. The artifact's own result is already written.

Returns what the harness writes into result.json's extra.paired: latencies_ns (the artifact's) and
partner_latencies_ns, one per pair, in order.
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


def measure(args, loaded, make_runner, slices, own_seconds=0.0, on_timeout=None) -> dict:
    """`own_seconds`: the artifact's own load and first call (the watchdog's scale)."""
    watchdog = Watchdog(on_timeout or (lambda why: None))
    limit = max(MIN_LIMIT_S, LIMIT_FACTOR * own_seconds)
    watchdog.arm(limit, "loading and warming the partner")
    try:
        return _measure(args, loaded, make_runner, slices, watchdog, limit)
    finally:
        watchdog.cancel()


def _measure(args, loaded, make_runner, slices, watchdog, limit) -> dict:
    data, n, axes = loaded
    mine = make_runner(args)
    partner = make_runner(argparse.Namespace(**{**vars(args), "model": args.pair_model}))
    batch = mine.batch_size(args.batch_size, axes["inputs"])
    if partner.batch_size(args.batch_size, axes["inputs"]) != batch:
        raise SystemExit("harness: the paired models take different batch sizes")
    spans = slices(min(n, max(1, args.pairs) * batch), batch)
    feeds = [(mine.prepare(data, a, b, axes["inputs"]), partner.prepare(data, a, b, axes["inputs"]))
             for a, b in spans]
    for _ in range(max(1, args.warmup)):
        mine.infer(feeds[0][0])
        partner.infer(feeds[0][1])
    watchdog.arm(args.pairs_seconds + limit, "the interleaved calls")
    clock = time.monotonic_ns
    deadline = clock() + int(args.pairs_seconds * 1e9)
    mine_ns, partner_ns = [], []
    for i in range(args.pairs):
        feed_mine, feed_partner = feeds[i % len(feeds)]
        calls = ((mine, feed_mine, mine_ns), (partner, feed_partner, partner_ns))
        for runner, feed, times in (calls if i % 2 == 0 else calls[::-1]):
            t0 = clock()
            runner.infer(feed)
            times.append(clock() - t0)
        if i % 2 == 1 and clock() > deadline:
            break
    return {"pairs": len(mine_ns), "asked": args.pairs, "batch_size": batch, "feeds": len(feeds),
            "order": "alternating: even pairs artifact first, odd pairs partner first",
            "partner": args.pair_model, "latencies_ns": mine_ns, "partner_latencies_ns": partner_ns}
