"""Calling user code with limits: the one home for running a data loader's or a metric's Python.

A loader (`--data FILE.py:FUNCTION`) and a user metric (`--metric FILE.py:FUNCTION`) are code the gate
did not write. `call(what, fn, *args)` runs one call of it so that nothing it does can pass for a verdict:

- it returns, or raises: any exception, `sys.exit()` (SystemExit) and every other BaseException but
  KeyboardInterrupt become one InputError naming `what` (exit 2); a KeyboardInterrupt stays one;
- its output never reaches stdout (where `--json` is written): while it runs, stdout is redirected to stderr
  at the file-descriptor level (fd 1 onto fd 2, `sys.stdout` onto `sys.stderr`), so C code printing is
  covered too; C stdio buffers are flushed before stdout is given back;
- it returns within the timeout (`TIERGATE_USER_CODE_TIMEOUT_S`, default 300 s, per call), else an
  InputError saying which function hung.

It runs in a daemon thread, not a child process: a metric computed on the whole set is called once per bootstrap
resample (hundreds of times, on one `Worker` thread) on outputs that can be hundreds of MB, and a loader's arrays
come back as they are; a process per call, or shipping the arrays through a pipe, would cost more than the metric.
The price: a call that timed out cannot be killed; it is abandoned (a daemon thread does not hold the
interpreter's exit, and the gate stops with exit 2), and stdout stays redirected to stderr until it ends. `os._exit` or a crash in C code
inside user code still ends the process (by its own exit status, never a printed verdict).
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator

from tiergate.errors import Interrupted, InputError, TiergateError

TIMEOUT_ENV = "TIERGATE_USER_CODE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0

_redirect_lock = threading.Lock()
_redirect_depth = 0
_saved: tuple[int, object] | None = None       # (dup of the real fd 1, the real sys.stdout)


def timeout_s() -> float:
    """The per-call limit on user code, from TIERGATE_USER_CODE_TIMEOUT_S (seconds, > 0)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{TIMEOUT_ENV}={raw!r}: expected a number of seconds greater than 0")
    return value


def call(what: str, fn, *args, timeout: float | None = None):
    """fn(*args) with limits (module docstring); `what` names it in every error ("metric f (m.py:f)")."""
    limit = timeout_s() if timeout is None else timeout
    box: dict = {}

    def body():
        _redirect_enter()
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - user code: everything it raises is reported below
            box["error"] = exc
        finally:
            _redirect_exit()

    worker = threading.Thread(target=body, name=f"tiergate-user-code {what}"[:60], daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        raise _hung(what, limit)
    if "error" in box:
        raise _as_error(what, box.pop("error"))
    return box["value"]


class Worker:
    """One thread for many calls of user code (a user metric's bootstrap: hundreds of calls), each call with the
    limits of `call` (its timeout, errors as one line), stdout onto stderr while the worker lives; a thread per
    call cost more than a small metric. `with Worker(what) as worker: worker.call(fn, *args)`."""

    def __init__(self, what: str, timeout: float | None = None):
        self.what, self.limit = what, timeout_s() if timeout is None else timeout
        self.jobs: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> "Worker":
        def body():
            _redirect_enter()
            try:
                while True:
                    job = self.jobs.get()
                    if job is None:
                        return
                    fn, args = job
                    try:
                        self.done.put(("value", fn(*args)))
                    except BaseException as exc:  # noqa: BLE001 - user code: everything it raises is reported
                        self.done.put(("error", exc))
            finally:
                _redirect_exit()

        self.thread = threading.Thread(target=body, name=f"tiergate-user-code {self.what}"[:60], daemon=True)
        self.thread.start()
        return self

    def call(self, fn, *args):
        self.jobs.put((fn, args))
        try:
            kind, payload = self.done.get(timeout=self.limit)
        except queue.Empty:
            # hung: abandoned (a daemon thread does not hold the interpreter's exit); it ends, giving stdout back,
            # if the call ever returns
            self.thread = None
            self.jobs.put(None)
            raise _hung(self.what, self.limit) from None
        if kind == "error":
            raise _as_error(self.what, payload)
        return payload

    def __exit__(self, *exc) -> None:
        if self.thread is not None:
            self.jobs.put(None)
            self.thread.join()


def iterate(what: str, make: Callable[[], object], item: Callable[[int], str],
            timeout: float | None = None) -> Iterator:
    """The items of the iterable `make()` returns, each fetched with the limits of `call` (one worker thread
    for all of them: a loader's samples cost no thread each). `what` names the call of `make`, `item(i)` the
    i-th item in errors ("data loader f.py:f: sample 3"). The caller may stop early: the worker then stops."""
    limit = timeout_s() if timeout is None else timeout
    box: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(message) -> None:
        while not stop.is_set():
            try:
                box.put(message, timeout=0.1)
                return
            except queue.Full:
                continue

    def body():
        _redirect_enter()
        called = False
        try:
            iterator = iter(make())
            called = True
            while not stop.is_set():
                try:
                    value = next(iterator)
                except StopIteration:
                    put(("end", None))
                    return
                put(("item", value))
        except BaseException as exc:  # noqa: BLE001 - user code: everything it raises is reported below
            put(("error" if called else "call error", exc))
        finally:
            _redirect_exit()

    worker = threading.Thread(target=body, name=f"tiergate-user-code {what}"[:60], daemon=True)
    worker.start()
    index = 0
    try:
        while True:
            try:
                kind, payload = box.get(timeout=limit)
            except queue.Empty:
                raise _hung(item(index), limit) from None
            if kind == "end":
                return
            if kind != "item":
                raise _as_error(what if kind == "call error" else item(index), payload)
            yield payload
            index += 1
    finally:
        stop.set()


_PROGRESS: list = []       # the running gate's progress printer (orchestrator.gate: `reporting`), innermost last


@contextlib.contextmanager
def reporting(progress: Callable[[str], None] | None) -> Iterator[None]:
    """While a gate runs: where `report` says how a long call of user code goes (a metric's bootstrap)."""
    _PROGRESS.append(progress)
    try:
        yield
    finally:
        _PROGRESS.remove(progress)


def report(text: str) -> None:
    """One progress line for the running gate (nothing outside a gate, or with no progress printer)."""
    progress = _PROGRESS[-1] if _PROGRESS else None
    if progress is not None:
        progress(text)


def _hung(what: str, limit: float) -> InputError:
    return InputError(f"{what}: did not return within {limit:g} s (a hang?); the limit per call is "
                      f"{TIMEOUT_ENV} (default {DEFAULT_TIMEOUT_S:g})")


def _as_error(what: str, exc: BaseException) -> BaseException:
    """What user code raised, as the gate reports it: its own errors and interrupts as they are, anything
    else (sys.exit included) one InputError naming `what`."""
    if isinstance(exc, (TiergateError, KeyboardInterrupt, Interrupted)):
        return exc
    if isinstance(exc, SystemExit):
        return InputError(f"{what}: called sys.exit({exc.code!r}); user code must return a value or raise, "
                          "never exit the gate")
    return InputError(f"{what}: raised {type(exc).__name__}: {exc}")


def env_limit(name: str, default: int) -> int:
    """A whole-number limit from the environment (at least 1), else `default`."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise InputError(f"{name}={raw!r}: expected a whole number of at least 1")
    return int(raw)


def real_number(what: str, value) -> float:
    """A user function's result as a finite float: int, float and numpy real scalars (or a size-1 real
    array); bool, str, None, complex, arrays of another size and non-finite values are one InputError."""
    number = None
    if not isinstance(value, bool) and type(value).__name__ != "bool_":
        if isinstance(value, numbers.Real):
            number = float(value)
        elif hasattr(value, "dtype") and hasattr(value, "size") and getattr(value, "size", 0) == 1 \
                and getattr(value.dtype, "kind", "") in "iuf":
            number = float(value.reshape(()) if hasattr(value, "reshape") else value)
    if number is None:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise InputError(f"{what}: returned {shown} ({type(value).__name__}), not a real number (a float)")
    if not math.isfinite(number):
        raise InputError(f"{what}: returned {value!r}, not a finite number")
    return number


# --- stdout onto stderr while user code runs ----------------------------------------------------------------


@functools.cache
def _libc():
    import ctypes

    return ctypes.CDLL(None)


def _flush_c_stdio() -> None:
    try:
        _libc().fflush(None)       # loaded once
    except Exception:  # noqa: BLE001 - no libc to flush (not POSIX): Python's own buffers are flushed
        pass


def _redirect_enter() -> None:
    global _redirect_depth, _saved
    with _redirect_lock:
        _redirect_depth += 1
        if _redirect_depth > 1:
            return
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001
            pass
        _flush_c_stdio()
        try:
            real_fd = os.dup(1)
            os.dup2(2, 1)
        except OSError:
            real_fd = -1          # no fd 1 or 2 (embedded): sys.stdout is still redirected
        _saved = (real_fd, sys.stdout)
        sys.stdout = sys.stderr


def _redirect_exit() -> None:
    global _redirect_depth, _saved
    with _redirect_lock:
        _redirect_depth -= 1
        if _redirect_depth > 0 or _saved is None:
            return
        real_fd, real_stdout = _saved
        _saved = None
        try:
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        _flush_c_stdio()
        sys.stdout = real_stdout
        if real_fd >= 0:
            os.dup2(real_fd, 1)
            os.close(real_fd)
