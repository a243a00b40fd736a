"""Batched evaluation (--eval-batch), its calls made at once (--eval-workers) under the container's call slots.

Every sample's outputs in calls of --eval-batch samples (`batched_outputs`), checked against the timed calls'
outputs (`consistency`: |a - b| <= 1e-4 * max|a| + 1e-6, integers exactly; a difference discards them and every
sample runs at the class's batch size). With W workers, W threads of the artifact's process claim the calls in
order from a schedule fixed by (samples, --eval-batch, W) (`eval_schedule`), each call holding one of the
container's slots (`CallSlots`, one more per SIGUSR1 the host sends after READY_MARK: `call_slots`).

CALLS_AT_ONCE is the one list of the runtimes whose calls may run at once in one process: the harness makes
concurrent calls only for these (make_runner sets runner.concurrent from it), and the host spreads a tier's
batched calls over one container only for these (tiergate.orchestrator.spans.spread_workers reads it from this
file's source: tiergate.harness_source.calls_at_once). Keep it a literal tuple.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
from harness_data import Outputs, sample_axes, slices

CALLS_AT_ONCE = ("onnxruntime",)     # onnxruntime's CPU session: session.run may be called from several threads

READY_MARK = "harness: ready for more call slots"   # SIGUSR1 (a slot more) is handled from here on


def call_slots(args):
    """With --eval-workers N > 1: the container's CallSlots, --eval-slots of them at first (the host's run slots
    held at the start), one more per SIGUSR1 (another slot the host took since), at most N."""
    if args.eval_workers <= 1:
        return None
    slots = CallSlots(args.eval_slots or args.eval_workers, args.eval_workers)
    signal.signal(signal.SIGUSR1, slots.grant)
    print(READY_MARK, flush=True)
    return slots


def eval_schedule(n, eval_batch, workers):
    """The calls of a batched evaluation: `eval_batch` samples each, and where several workers share them, calls
    that shrink towards the end (what is left over twice the workers, down to single samples), so that the workers,
    and the artifacts that share the container's call slots, end together (a last call of 8 samples kept one core
    of the PaddleOCR gate busy alone for 0.8 s under QEMU); fixed by (n, eval_batch, workers) alone, whichever
    worker makes which call."""
    if workers <= 1:
        return slices(n, eval_batch)
    spans, start = [], 0
    while start < n:
        size = min(eval_batch, max(1, -(-(n - start) // (2 * workers))), n - start)
        spans.append((start, start + size))
        start += size
    return spans


class CallSlots:
    """How many batched calls may run at once in this container, across the artifacts' processes: `allowed` (an
    int in memory shared with every child forked after it is made) of the lock files under a temporary folder,
    each held (flock) by the call that runs. The kernel lets a lock go when its holder dies, so a child that crashes
    mid-call takes no slot with it. The host gives a run another CPU with SIGUSR1 (`grant`, from the harness's
    main process), up to `most`.

    A take() that finds every slot held sleeps on a pipe shared with the children (`wake`: a byte per slot given
    back or granted wakes one rescan), not in a polling loop: under QEMU a poll costs 2-3 % of a core per waiting
    thread, and while two artifacts share the slots two or three threads wait. A holder that died gives its slot
    back through the kernel, without a byte: a waiter rescans every WAKE_S in any case."""

    WAKE_S = 0.5

    def __init__(self, now, most):
        import mmap
        import tempfile

        self.most = max(1, most)
        self.folder = tempfile.mkdtemp(prefix="tiergate-slots-")
        self.shared = mmap.mmap(-1, 8)         # MAP_SHARED | MAP_ANONYMOUS: the children see the parent's grants
        self.set(min(max(1, now), self.most))
        self.wake_r, self.wake_w = os.pipe()   # inherited by every child forked after it is made
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def allowed(self):
        return int.from_bytes(self.shared[:8], "little")

    def set(self, n):
        self.shared[:8] = int(n).to_bytes(8, "little")

    def grant(self, *_):
        self.set(min(self.allowed() + 1, self.most))
        self.wake()

    def wake(self):
        """One waiting take() looks again (a write into a full pipe is dropped: its readers are awake already)."""
        try:
            os.write(self.wake_w, b"s")
        except OSError:
            pass

    def give(self, fd):
        """Give back a slot take() returned."""
        os.close(fd)
        self.wake()

    def take(self):
        """An open, locked slot file (give it back with give())."""
        import fcntl
        import select

        while True:
            for k in range(self.allowed()):
                fd = os.open(os.path.join(self.folder, str(k)), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except OSError:
                    os.close(fd)
            if select.select([self.wake_r], [], [], self.WAKE_S)[0]:
                try:
                    os.read(self.wake_r, 1)       # one byte: a second slot given back wakes another waiter
                except OSError:                   # another waiter read it first
                    pass


def concurrent_calls(runner, spans, call, workers, slots=None, last_claimed=None, room=None):
    """call(i, span) for every span, on up to `workers` threads of this process claiming the spans in order (a
    runtime whose calls may run at once: onnxruntime's session.run; each call uses the device class's threads as
    before), each call holding one of `slots` (CallSlots) while it runs, and a call beside another only while
    `room()` says one more fits in memory. `last_claimed()` is called once the workers' last round begins (the
    first of the last `workers` spans is handed out; one worker: the last): the next artifact may start, its load
    and single calls beside those last calls. -> the most calls that ran at once. The first error raised ends the
    evaluation."""
    workers = min(workers, len(spans)) if getattr(runner, "concurrent", False) else 1
    if workers <= 1 or slots is None:
        for i, span in enumerate(spans):
            if i == len(spans) - 1 and last_claimed is not None:
                last_claimed()
            call(i, span)
        return 1
    import threading

    claim, errors, lock, at_once = iter(range(len(spans))), [], threading.Lock(), [0, 0]    # now, most

    def work():
        while not errors:
            fd = slots.take()
            if at_once[0] and room is not None and not room():
                slots.give(fd)        # another call runs, and one more would not fit under the memory limit
                time.sleep(0.05)
                continue
            try:
                with lock:
                    i = next(claim, None)
                    if i is not None:
                        at_once[0] += 1
                        at_once[1] = max(at_once)
                if i is None:
                    return
                if i == len(spans) - workers and last_claimed is not None:    # the first of the last rounds'
                    last_claimed()
                try:
                    call(i, spans[i])
                finally:
                    with lock:
                        at_once[0] -= 1
            except BaseException as exc:  # noqa: BLE001 - raised in the main thread below
                errors.append(exc)
            finally:
                slots.give(fd)
    threads = [threading.Thread(target=work, name=f"eval-{k}", daemon=True) for k in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return at_once[1]


def batched_outputs(runner, data, n, axes, batch, eval_batch, timed_store, workers=1, slots=None,
                    last_claimed=None):
    """Every sample's outputs in calls of `eval_batch` (on up to `workers` threads: concurrent_calls), checked
    against the timed calls' outputs; on a difference beyond float rounding, every sample at `batch` instead.
    (the store to keep, extra.evaluation)"""
    import harness_memory as memory

    clock, single = time.monotonic_ns, runner.device.get("inference_memory_bytes")
    workers = workers if getattr(runner, "concurrent", False) else 1
    eval_batch = memory.fitting_batch(single, eval_batch, batch, workers)     # so that the workers' calls fit at once
    spans = eval_schedule(n, eval_batch, workers)
    store = Outputs(spans, runner.output_names, lambda span: sample_axes(data, axes, span))
    call_ns = []

    def call(i, span):
        feed = runner.prepare(data, *span, axes["inputs"])
        t0 = clock()
        out = runner.infer(feed)
        call_ns.append(clock() - t0)
        store(i, out)
    most = concurrent_calls(runner, spans, call, workers, slots, last_claimed,
                            room=memory.call_room(single, eval_batch, batch))
    eval_ns = sum(call_ns)      # the calls' own time: per sample, what one worker spends
    checked = timed_store.spans[-1][1]
    worst, agree = consistency(timed_store.arrays(), store.arrays(), checked)
    evaluation = {"batched": agree, "latency_batch": batch, "latency_calls": len(timed_store.spans),
                  "eval_batch": eval_batch, "eval_calls": len(spans), "eval_ms_per_sample": eval_ns / 1e6 / n,
                  "checked_samples": checked, "max_abs_diff": worst}
    if workers > 1:     # threads making the calls, the most calls that ran at once, and the call slots granted
        evaluation.update(eval_workers=workers, eval_at_once=most,
                          eval_slots=slots.allowed() if slots is not None else 1)
    if agree:
        return store, evaluation
    evaluation["reason"] = (f"outputs of calls of {eval_batch} samples differ from calls of {batch} by up to "
                            f"{worst:.3g}: every sample evaluated at batch {batch}")
    spans = slices(n, batch)
    single = Outputs(spans, runner.output_names, lambda span: sample_axes(data, axes, span))
    for i, (a, b) in enumerate(spans):
        single(i, runner.infer(runner.prepare(data, a, b, axes["inputs"])))
    return single, evaluation


def consistency(timed, batched, k):
    """(largest |difference| over the first k samples, whether every output agrees within float rounding)."""
    worst, agree = 0.0, True
    for name, a in timed.items():
        b = batched[name][:k]
        if a.shape != b.shape:
            return float("inf"), False
        if np.issubdtype(a.dtype, np.floating):
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            if not (np.array_equal(np.isnan(a64), np.isnan(b64)) and np.array_equal(np.isinf(a64), np.isinf(b64))):
                return float("inf"), False
            finite = np.isfinite(a64)
            diff = float(np.max(np.abs(a64[finite] - b64[finite]), initial=0.0))
            scale = float(np.max(np.abs(a64[finite]), initial=0.0))
            worst = max(worst, diff)
            agree = agree and diff <= 1e-4 * scale + 1e-6
        else:
            same = np.array_equal(a, b)
            worst = max(worst, 0.0 if same else float("inf"))
            agree = agree and same
    return worst, agree
