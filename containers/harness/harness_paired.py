"""--pair-model P --pairs K (tiergate_harness.py): the artifact's calls interleaved with a partner's.

Imported only when --pair-model is given (native classes: the candidate's run pairs with the FP32
reference). After the artifact's own run (its result and memory figures written), both models are
loaded in this process, warmed up, and called alternately on the same feeds: pair i times the artifact
then the partner when i is even, the partner then the artifact when odd, so that neither always runs
second (caches warmed by the other, a frequency step). A machine that slows down for a while slows both
calls of a pair: the per-pair ratio is what stays trustworthy on a noisy host, where two separate loops'
means are not. At most K pairs, and no more than --pairs-seconds of calls (whole AB/BA rounds).

Returns what the harness writes into result.json's extra.paired: latencies_ns (the artifact's) and
partner_latencies_ns, one per pair, in order.
"""

from __future__ import annotations

import argparse
import time


def measure(args, loaded, make_runner, slices) -> dict:
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
