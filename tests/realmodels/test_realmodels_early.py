"""Early decision on a real model: PaddleOCR's text-direction classifier, INT8 candidates of three calibrations
against FP32 on 400 rendered lines. With early decision on, every verdict is the full gate's (and a failing
check fails in both); a clear REJECT stops at the first look, on half the samples, on the emulated arm64 tier
where early decision is on by default."""

from __future__ import annotations

import numpy as np
import pytest

import gatekit
from tiergate.gate import REJECT
from tiergate.policy import load_policy
from tiergate.targets import resolve

from .kit import int8_calibrated, int8_narrow, text_lines

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.slow]

X86 = "x86_64-cpu-onnxruntime"
ARM = "arm64-cpu-onnxruntime"


@pytest.fixture(scope="module")
def lines(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("early-lines")
    source = real_model("paddleocr_cls")
    x, labels = text_lines(400, seed=1)
    data = folder / "lines.npz"
    np.savez(data, x=x, labels=labels)
    calibration = text_lines(64, seed=2)[0]
    candidates = {"calibrated": int8_calibrated(source, folder, calibration),
                  "narrow": int8_narrow(source, folder, calibration),
                  "clear": int8_narrow(source, folder, calibration, percentile=97.0)}
    return source, data, candidates


def _failing(decision) -> set:
    return {(c.device_class, c.name) for c in decision.checks if not c.passed}


def test_early_decision_gives_the_full_gates_verdict(lines, realmodels_home):
    source, data, candidates = lines
    for name, candidate in candidates.items():
        full = gatekit.gate(candidate, source, data, resolve([X86]), load_policy(), early_stop=False).decision
        early = gatekit.gate(candidate, source, data, resolve([X86]), load_policy(), early_stop=True).decision
        tier = early.early_stop[X86]
        print(f"PaddleOCR cls INT8 ({name}) on {X86}: full {full.verdict}, early {early.verdict} at look {tier.look} "
              f"of {tier.looks} on {tier.samples_used} samples")
        assert early.verdict == full.verdict, (name, full.reasons, early.reasons)
        assert _failing(early) == _failing(full), name
    assert early.verdict == REJECT and tier.stopped_early and tier.samples_used == 200     # the clear one


@pytest.mark.emulated
def test_a_clear_reject_stops_at_half_the_samples_on_the_emulated_tier_by_default(lines, realmodels_home):
    source, data, candidates = lines
    run = gatekit.gate(candidates["clear"], source, data, resolve([ARM]), load_policy())
    tier = run.decision.early_stop[ARM]
    print(f"PaddleOCR cls clear INT8 on {ARM}: {run.decision.verdict} at look {tier.look} of {tier.looks}, "
          f"{tier.samples_used} samples, containers started {run.containers_started}")
    assert run.decision.verdict == REJECT and tier.stopped_early and (tier.look, tier.samples_used) == (1, 200)
    assert _failing(run.decision) == {(ARM, "accuracy_ratio")}


@pytest.mark.emulated
def test_a_final_reject_on_x86_stops_the_emulated_tier_at_once(lines, realmodels_home, tmp_path, monkeypatch):
    """x86 (native: one look on every sample) REJECTs the clear INT8 while arm64's first chunk runs under QEMU:
    the gate's verdict is REJECT whatever arm64 shows, so arm64's running containers are killed and it is
    reported stopped; the full gate's verdict is the same (test_early_decision_gives_the_full_gates_verdict).
    The order is made, not raced: x86's runs are cached first (a gate of x86 alone, in a home of its own), and in
    the two-tier gate x86's run step waits until one of arm64's containers runs; then x86's REJECT, judged at
    once from its cached runs, must stop a container that has just started."""
    import os
    import time

    import docker

    from tiergate import orchestrator
    from tiergate.execution import janitor
    from tiergate.images import LABEL

    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home"))
    source, data, candidates = lines
    alone = gatekit.gate(candidates["clear"], source, data, resolve([X86]), load_policy())
    assert alone.decision.verdict == REJECT
    client = docker.from_env()
    mine = {"label": [f"{janitor.OWNER_PID}={os.getpid()}", f"{LABEL}.device_class={ARM}"]}
    steps = gatekit.steps_once_running(X86, lambda: client.containers.list(filters={**mine, "status": "running"}))
    t0 = time.monotonic()
    run = gatekit.gate(candidates["clear"], source, data, resolve([X86, ARM]), load_policy(),
                       seams=orchestrator.Seams(steps=steps))
    wall = time.monotonic() - t0
    d = run.decision
    print(f"PaddleOCR cls clear INT8 on {X86} + {ARM}: {d.verdict} in {wall:.1f} s; arm64 {d.early_stop[ARM]}")
    assert steps.seen and d.verdict == REJECT and d.early_stop[X86].verdict == REJECT
    assert d.early_stop[ARM].stopped_by == X86 and d.early_stop[ARM].look == 0
    assert [c.name for c in d.checks if c.device_class == ARM] == ["stopped"]
    left = client.containers.list(all=True, filters={"label": f"{janitor.OWNER_PID}={os.getpid()}"})
    assert not left, [c.name for c in left]          # the killed containers are gone
