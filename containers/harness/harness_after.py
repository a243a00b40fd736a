"""After an artifact's result is written (tiergate_harness.py): its runtime graph described (--describe N,
tiergate_describe.py; where its batched calls run at once, in a process of its own beside them: DescribeBeside)
and its calls interleaved with --pair-model's (harness_paired.py), each in its own files or result.json's
extra.paired, so no figure of the run changes; a step that fails says why and the run stays a result.
"""

from __future__ import annotations

import json
import os
import sys

from harness_data import slices
from harness_output import write_json
from harness_runners import make_runner


def describe_after(args, wanted):
    """The artifact's runtime graph at the level it ran beside its finished result (the describer's own files),
    when asked: the run's figures are written first, so the describe's session changes none of them. A describe that fails
    leaves no describe.json: the host then describes the artifact in a container of its own."""
    if not wanted:
        return
    try:
        import tiergate_describe

        tiergate_describe.describe(args.runtime, args.model, args.out, args.threads, own_level=True,
                                   disabled=getattr(args, "disabled_passes", []))
    except Exception as exc:  # noqa: BLE001 - the run is done and stays a result; the host describes it apart
        print(f"harness: describing {args.model} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        _drop_description(args.out)


def describe_own(args, own, runner):
    """describe.json from the run's own session (--describe-at-load: tiergate_describe.OwnSession), its load time
    as the level's seconds; one that fails leaves none (the host then describes the artifact apart)."""
    try:
        own.write(runner.session, runner.device["load_ms"] / 1e3)
    except Exception as exc:  # noqa: BLE001 - the run is done and stays a result
        print(f"harness: describing {args.model} from its session failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        _drop_description(args.out)


def _drop_description(out):
    """No describe.json in `out`: the host then describes the artifact in a container of its own."""
    try:
        os.remove(os.path.join(out, "describe.json"))
    except OSError:
        pass


def describe_beside(args, wanted):
    """A DescribeBeside hook for an artifact whose describe may run beside its own batched calls (call slots: its
    container makes batched calls at once), else None (the describe comes after the result: describe_after). The
    harness asks for none under the counting QEMU, whose figures are the artifact's process's alone."""
    if not wanted or getattr(args, "slots", None) is None:
        return None
    return DescribeBeside(args)


class DescribeBeside:
    """The describe in a process of its own, forked once the artifact's timed calls are done (`after_timed_loop`: no
    timed call runs beside it) and holding one call slot while it runs, like one more batched call: a core the
    batched calls leave free at their end is no longer idle while the describe runs alone after the result (under
    QEMU an INT8's describe takes a second or more). Its files are the same; `finish()`, after the result is
    written, waits for it. A process that never started (nothing was timed) describes there instead; one that
    died leaves no describe.json (the host then describes the artifact apart)."""

    def __init__(self, args):
        self.args, self.pid = args, None

    def after_timed_loop(self, runner, feeds):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _die_with_parent()
                fd = self.args.slots.take()         # given back when this process ends (the kernel's flock)
                describe_after(self.args, True)
                self.args.slots.give(fd)
            except BaseException:  # noqa: BLE001 - the run goes on; finish() sees the exit code
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.pid = pid

    def finish(self):
        if self.pid is None:
            describe_after(self.args, True)
            return
        code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        if code != 0:
            print(f"harness: describing {self.args.model} beside its calls ended with "
                  f"{'signal ' + str(-code) if code < 0 else 'code ' + str(code)}", file=sys.stderr)
            _drop_description(self.args.out)


def _die_with_parent():
    """The describe's process ends with the artifact's (one killed past its time leaves no describe running)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))        # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not every libc has it: the describe then ends on its own
        pass


def pair_after(args, loaded, wanted):
    """The artifact's calls interleaved with --pair-model's (harness_paired.py), after its result is written (so
    no figure of the run changes), added to its result.json as extra.paired; a pairing that fails or does not
    end says why there (extra.paired.error) and the run stays a result."""
    if not wanted:
        return
    path = os.path.join(args.out, "result.json")
    with open(path) as fh:
        device = json.load(fh).get("device") or {}
    own = (device.get("load_ms", 0) + device.get("first_inference_ms", 0)) / 1000

    def failed(text):
        print(f"harness: pairing {args.model} with {args.pair_model} failed: {text}", file=sys.stderr)
        _add_paired(path, {"error": " ".join(str(text).split())[:300]})

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()          # a partner that crashes takes the pairing's process down, not the artifact's run
    if pid == 0:
        try:
            import harness_paired

            _add_paired(path, harness_paired.measure(args, loaded, make_runner, slices, own, failed))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the run is done; the host falls back to its loops
            failed(exc.code if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code != 0:
        failed(f"the pairing's process was killed by signal {-code}" if code < 0 else f"exited with code {code}")


def _add_paired(path, paired):
    with open(path) as fh:
        result = json.load(fh)
    result["extra"]["paired"] = paired
    write_json(path, result)
