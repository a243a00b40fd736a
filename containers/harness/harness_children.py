"""Several artifacts, one process start (tiergate_harness.py with several --model/--out pairs).

The runtime library is imported and the data read once, in the harness's main process; each artifact then runs in
a child forked from there (`start_child`), so its memory figures, and a crash, are its own: a child that dies
leaves failed.json with the reason in its folder (harness_output.fail), and the next artifact runs. --timeout S:
each child has S seconds (its load, warm-up and every call); one still running then is killed, its failed.json
says "timed out after S s" (`timed_out`: true). With call slots (--eval-workers), the next artifact's child starts
once this one's workers began their last round of batched calls (or sooner, where more call slots are granted than
artifacts started). DONE_MARK + an artifact's index on stdout: its folder is complete (the host may collect it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from harness_output import FAILED_FILE, fail

DONE_MARK = "harness: finished artifact "     # + its index: its folder is complete (result or failed.json)


def run_each(args, work):
    """Every artifact of `args` (--model/--out pairs), each in its own child that calls work(its args): the
    args with its own model, out, describe_it, pair_it and disabled_passes."""
    # with call slots, the next artifact starts once this one's workers began their last round of batched calls
    # (its load and single calls then run beside those calls), or sooner where more call slots are granted than
    # artifacts started (the host's other tiers have ended: a core for its start); otherwise once this one has ended
    running = []       # (index, its args, pid, deadline), oldest first

    def reap():        # the oldest artifacts that have ended: their folders are complete
        while running:
            done, status = os.waitpid(running[0][2], os.WNOHANG)
            if not done:
                return
            finish(*running.pop(0)[:2], status)

    def room():        # more call slots granted than artifacts started: the next one's start need not wait
        return args.slots.allowed() > len(running) + 1

    for n, (model, out) in enumerate(zip(args.models, args.outs)):
        child = argparse.Namespace(**{**vars(args), "model": model, "out": out, "describe_it": n in args.describe,
                                      "disabled_passes": args.disabled_of.get(n, []),
                                      "pair_it": bool(args.pair_model) and n == args.pair_index})
        running.append((n, child, *start_child(child, work, overlap=args.slots is not None, meanwhile=reap,
                                                early=room)))
        if args.slots is None:
            n, child, pid, deadline = running.pop()
            finish(n, child, wait_child(pid, deadline))
    while running:
        n, child, pid, deadline = running.pop(0)
        finish(n, child, wait_child(pid, deadline))


def finish(n, args, status):
    finish_child(args, status)
    print(f"{DONE_MARK}{n}", flush=True)      # the host may collect this artifact's folder now


def start_child(args, work, overlap=False, meanwhile=None, early=None):
    """One artifact in a forked child, which calls work(args): its own peak memory, and its crash is its own
    (failed.json says why).
    -> (pid, deadline: its --timeout from now, or None). With `overlap`, returns once the child's workers began their
    last round of batched calls (or it ended, or run out of time, or `early()` says so), calling `meanwhile()` every
    0.2 s until then; else at once."""
    os.makedirs(args.out, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    ready_r, ready_w = os.pipe() if overlap else (None, None)
    pid = os.fork()
    if pid == 0:                                       # the child: run, write, leave without cleanup
        if ready_r is not None:
            os.close(ready_r)
            args.last_claimed = _say_ready([ready_w])
        code = 0
        try:
            work(args)
        except SystemExit as exc:                      # the harness's own one-line errors
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
                fail(args.out, str(exc.code), code)
            elif code:
                fail(args.out, f"exited with code {code}", code)
        except BaseException as exc:                  # noqa: BLE001 - the parent goes on with the next artifact
            import traceback

            traceback.print_exc()
            code = 1
            fail(args.out, f"{type(exc).__name__}: {exc}", code)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if ready_r is not None:
        os.close(ready_w)
        import select

        while deadline is None or time.monotonic() < deadline:
            # a byte: the last call is handed out; end of file: the child has ended
            if select.select([ready_r], [], [], 0.2)[0]:
                break
            if meanwhile is not None:
                meanwhile()
            if early is not None and early():
                break
        os.close(ready_r)
    return pid, deadline


def _say_ready(fds):
    """A function that writes a byte to the pipe fds[0] and closes it, once (a later call does nothing: the fd's
    number may be another file's by then)."""
    def say_once():
        while fds:
            fd = fds.pop()
            try:
                os.write(fd, b"r")
            except OSError:
                pass
            finally:
                os.close(fd)
    return say_once


def finish_child(args, status):
    """A child's end (its wait status; None: killed past its time): one that died without a word leaves its
    failed.json."""
    if status is None:                                 # past its time: killed, whatever it left is no result
        fail(args.out, f"timed out after {args.timeout:g} s", -9, timed_out=True)
        return
    if os.waitstatus_to_exitcode(status) != 0 and not os.path.exists(os.path.join(args.out, FAILED_FILE)):
        code = os.waitstatus_to_exitcode(status)
        fail(args.out, f"exited with code {code}" if code > 0 else f"killed by signal {-code}", code)


def wait_child(pid, deadline):
    """The child's wait status; None when it ran past `deadline` (time.monotonic; None: no limit), after killing
    it. Waited for as it ends (the last artifact's end is the container's), a timer thread killing it at the
    deadline; a child that ended by itself as the timer fired is no timeout."""
    if deadline is None:
        return os.waitpid(pid, 0)[1]
    import threading

    killed = threading.Event()

    def kill():
        killed.set()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), kill)
    timer.daemon = True
    timer.start()
    try:
        status = os.waitpid(pid, 0)[1]
    finally:
        timer.cancel()
    if killed.is_set() and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return None
    return status
