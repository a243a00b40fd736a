"""Device figures of one device class (tiergate.metrics.device): memory, load, first call, size, instructions;
their ratios and limits. Time and memory are not gated on emulated classes; instructions only there."""

from __future__ import annotations

import dataclasses

from tiergate.decision import TargetMetrics
from tiergate.metrics.device import FIGURES, ratios as device_ratios
from tiergate.results import MB
from tiergate.npu import is_npu


def figures(ev, m: TargetMetrics, cand, ref, inc) -> None:
    """Figures per side, ratios, and their limits; time and memory are not gated on emulated classes."""
    for outcome, who in ((cand, "candidate"), (ref, "FP32 reference")):
        limit = outcome.result.oom_limit_bytes
        if limit:
            ev.check("memory_limit", f"out of memory ({who})", "<", limit / MB, passed=False,
                     detail=f"the {who}'s run was killed at {ev.dc.name}'s memory limit of "
                              f"{limit / MB:.0f} MB (memory_limit_mb); it needs more on tier {ev.dc.tier}")
    if is_npu(ev.dc):                 # the host's memory and times, not the device's (npu_checks.NOT_TIMED)
        return
    for side, outcome in (("candidate", cand), ("reference", ref), ("incumbent", inc)):
        if outcome is not None and outcome.result.ok and outcome.result.device is not None:
            m.device[side] = dataclasses.replace(outcome.result.device, emulated=m.emulated)
    figures = m.device.get("candidate")
    m.device_ratios = {**device_ratios(figures, m.device.get("reference")),
                       **device_ratios(figures, m.device.get("incumbent"), "_vs_incumbent")}
    if not cand.ok:
        return
    if figures is None:
        ev.note("no device figures in the candidate's run (an older harness?): a device limit fails")
    skipped, uncounted = [], []
    for fig in FIGURES:
        limits = [(fig.name, fig.value(figures), getattr(ev.t, fig.limit_key), fig.limit_key),
                  (f"{fig.base}_ratio", m.device_ratios.get(f"{fig.base}_ratio"),
                   getattr(ev.t, fig.ratio_key), fig.ratio_key),
                  (f"{fig.base}_ratio_vs_incumbent", m.device_ratios.get(f"{fig.base}_ratio_vs_incumbent"),
                   getattr(ev.t, fig.incumbent_ratio_key), fig.incumbent_ratio_key)]
        for name, value, limit, key in limits:
            if limit is None or (name.endswith("_vs_incumbent") and inc is None):
                continue
            if m.emulated and fig.emulation_bound:
                skipped.append(key)
                continue
            if fig.counted and not m.emulated:
                uncounted.append(key)
                continue
            versus = "incumbent" if name.endswith("_vs_incumbent") else "FP32 reference"
            what = fig.meaning if name == fig.name else f"candidate / {versus}, {fig.meaning}"
            ev.check(name, value, "<=", limit, detail=f"{key} on tier {ev.dc.tier}: {what}"
                     + ("" if value is not None else " (not measured)"))
    if uncounted:
        ev.note(f"instructions are counted on emulated classes only (under the counting QEMU): not gated "
                f"natively ({', '.join(uncounted)})")
    if skipped:
        ev.note(f"device figures are emulated (QEMU user mode: memory includes the emulator): reported, "
                f"not gated ({', '.join(skipped)})")
