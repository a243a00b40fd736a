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
        if i % 2 == 0:
            t0 = clock()
            mine.infer(feed_mine)
            t1 = clock()
            partner.infer(feed_partner)
            t2 = clock()
            mine_ns.append(t1 - t0)
            partner_ns.append(t2 - t1)
        else:
            t0 = clock()
            partner.infer(feed_partner)
            t1 = clock()
            mine.infer(feed_mine)
            t2 = clock()
            partner_ns.append(t1 - t0)
            mine_ns.append(t2 - t1)
            if t2 > deadline:
                break
    return {"pairs": len(mine_ns), "asked": args.pairs, "batch_size": batch, "feeds": len(feeds),
            "order": "alternating: even pairs artifact first, odd pairs partner first",
            "partner": args.pair_model, "latencies_ns": mine_ns, "partner_latencies_ns": partner_ns}
