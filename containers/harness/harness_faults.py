"""Test-only fault injection for the harness (TIERGATE_HARNESS_FAULT; see docs/execution.md).

Imported by tiergate_harness.py only when TIERGATE_HARNESS_FAULT is set. After the
model is loaded:
  segv  the process dies of a real SIGSEGV (a read of address 0)
  hang  the process sleeps forever (the backend's timeout must end it)
Before the model is loaded:
  await-slots  waits (60 s at most) until every --eval-workers call slot is granted (the host's
               SIGUSR1s have reached the harness), then runs as usual
"""

from __future__ import annotations

import ctypes
import sys
import time

FAULTS = ("segv", "hang", "await-slots")


class FaultHook:
    def __init__(self, fault):
        self.fault = fault

    def before_load(self, args):
        slots = getattr(args, "slots", None)
        if self.fault != "await-slots" or slots is None:
            return
        deadline = time.monotonic() + 60
        while slots.allowed() < slots.most and time.monotonic() < deadline:
            time.sleep(0.05)

    def loaded(self, runner):
        if self.fault == "await-slots":
            return
        sys.stderr.write(f"harness: TIERGATE_HARNESS_FAULT={self.fault}: "
                         f"{'reading address 0' if self.fault == 'segv' else 'sleeping'}\n")
        sys.stderr.flush()
        if self.fault == "segv":
            ctypes.string_at(0)
        while True:
            time.sleep(3600)


def hook(fault):
    if fault not in FAULTS:
        raise SystemExit(f"harness: TIERGATE_HARNESS_FAULT={fault!r} is unknown (known: {', '.join(FAULTS)})")
    return FaultHook(fault)
