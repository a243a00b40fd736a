"""Instructions per inference, counted by the counting QEMU's plugin (containers/qemu-count/tiergate_count.c).

Only where the host started the harness under that QEMU: it sets COUNT_ENV to the plugin's output prefix. The
harness then makes the marker syscall (MARK_NR, which no Linux architecture has: ENOSYS, nothing else) at four
points: before and after the model's load, before and after each timed call. The plugin appends the running
totals at each (the marking thread's and the whole process's) to PREFIX.PID; a call's instructions are the
difference of its two markers. The counts are exact: the same on a loaded host as on an idle one.
"""

import ctypes
import os

COUNT_ENV = "TIERGATE_COUNT_OUT"
READS_ENV = "TIERGATE_COUNT_READS"     # "1": the plugin counts memory reads too (off by default: their cost)
MARK_NR = 0x7467
LOAD, LOADED, CALL, CALLED = 1, 2, 3, 4


def marker():
    """mark(code), or None when this run is not counted."""
    if not os.environ.get(COUNT_ENV):
        return None
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_long]

    def mark(code):
        syscall(MARK_NR, code)
    return mark


def figures(threads=1):
    """The device figures of this process's markers: instructions per inference (median over the timed calls),
    their relative spread, memory reads per inference, and the load's instructions; {} if the plugin wrote none
    (the harness not under the counting QEMU after all)."""
    path = f"{os.environ[COUNT_ENV]}.{os.getpid()}"
    try:
        with open(path) as fh:
            rows = [tuple(int(x) for x in line.split()) for line in fh if line.strip()]
    except OSError:
        return {}
    # the marking thread's counts for a single-threaded runtime (another thread's work in the window depends on
    # timing); every thread's for a runtime with worker threads (their work is the call's)
    i, r = (1, 2) if threads <= 1 else (3, 4)
    load = [(b[i] - a[i]) for a, b in zip(rows, rows[1:]) if a[0] == LOAD and b[0] == LOADED]
    calls = [(b[i] - a[i], b[r] - a[r]) for a, b in zip(rows, rows[1:]) if a[0] == CALL and b[0] == CALLED]
    if not calls:
        return {}
    insns = sorted(c[0] for c in calls)
    reads = sorted(c[1] for c in calls)
    median = _median(insns)
    return {"instructions_per_inference": median,
            "instructions_spread": (insns[-1] - insns[0]) / median if median else 0.0,
            "instructions_calls": len(insns),
            "reads_per_inference": _median(reads) if os.environ.get(READS_ENV) == "1" else None,
            "load_instructions": load[-1] if load else None,
            "instructions_source": "qemu-tcg-plugin " + ("marking thread" if threads <= 1 else "all threads")}


def _median(xs):
    n = len(xs)
    return float(xs[n // 2]) if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
