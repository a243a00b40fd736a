"""Test-only fault injection for the harness (TIERGATE_HARNESS_FAULT; see docs/execution.md).

Imported by tiergate_harness.py only when TIERGATE_HARNESS_FAULT is set. After the
model is loaded:
  segv  the process dies of a real SIGSEGV (a read of address 0)
  hang  the process sleeps forever (the backend's timeout must end it)
"""

from __future__ import annotations

import ctypes
import sys
import time

FAULTS = ("segv", "hang")


class FaultHook:
    def __init__(self, fault):
        self.fault = fault

    def loaded(self, runner):
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
