"""PP-OCRv4's text detector on x86 + emulated arm64 with the issue's user metric (issue 46, items 1 and 1b): labels
(each page's index into a boxes file beside the metric) whose class count the detector's output cannot say (its map
is as large as its input), a user `text_iou` that returns each page's intersection and union, and too few pages for
an early look on arm64. x86's final REJECT still stops arm64 at once, and the interval comes from one call per side.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import gatekit
from realmodels import taskdata

pytestmark = [pytest.mark.realmodels, pytest.mark.docker, pytest.mark.emulated, pytest.mark.slow]

X86, ARM = "x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"
PAGES = 40



@pytest.fixture(scope="module")
def det(real_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("det-tiers")
    model = real_model("ppocr_det")
    x, boxes = taskdata.det_pages(PAGES, 1)
    taskdata.text_iou_metric(folder, boxes)
    np.savez(folder / "pages.npz", x=x, labels=np.arange(PAGES, dtype=np.int64))     # page indices
    (folder / "policy.toml").write_text("[metrics.text_iou]\nmax_drop = 0.05\n")
    blank, _ = taskdata.det_pages(8, 3, blank=True)
    return {"model": model, "folder": folder, "blank": taskdata.det_int8(model, folder, blank, "blank")}


def test_x86s_reject_stops_arm64_at_once_with_labels_of_a_dynamic_output_and_a_per_sample_user_metric(
        det, tmp_path, monkeypatch):
    """x86's runs are made first (a gate of x86 alone, in the same home); then, in the two-tier gate, x86's run step
    starts only once arm64's container runs (the order is made, not raced): x86's REJECT, judged at once from its
    cached runs, is final and stops arm64, which has no early look on 40 pages (one look, stopped all the same)."""
    import docker

    from tiergate import orchestrator
    from tiergate.execution import janitor
    from tiergate.images import LABEL
    from tiergate.policy import load_policy
    from tiergate.targets import resolve

    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home"))
    policy, data = load_policy(det["folder"] / "policy.toml"), det["folder"] / "pages.npz"
    metric = f"{det['folder'] / 'metrics.py'}:text_iou"
    alone = gatekit.gate(det["blank"], det["model"], data, resolve([X86]), policy, metrics=[metric])
    check = next(c for c in alone.decision.checks if c.name == "text_iou_difference")
    assert alone.decision.verdict == "REJECT" and not check.passed and not check.inconclusive
    assert "per-sample values" in check.detail and check.interval.method.startswith("bootstrap-")
    assert alone.decision.metrics[X86].task["text_iou"].candidate < 0.05 < alone.decision.metrics[X86].task[
        "text_iou"].reference

    client = docker.from_env()
    mine = {"label": [f"{janitor.OWNER_PID}={os.getpid()}", f"{LABEL}.device_class={ARM}"]}
    steps = gatekit.steps_once_running(X86, lambda: client.containers.list(filters={**mine, "status": "running"}))
    t0 = time.monotonic()
    run = gatekit.gate(det["blank"], det["model"], data, resolve([X86, ARM]), policy, metrics=[metric],
                       seams=orchestrator.Seams(steps=steps))
    wall = time.monotonic() - t0
    d = run.decision
    print(f"PP-OCRv4 det blank INT8 on {X86} + {ARM}, {PAGES} pages, text_iou per page: {d.verdict} in {wall:.1f} s; "
          f"arm64 {d.early_stop[ARM]}")
    assert steps.seen and d.verdict == "REJECT"
    assert d.early_stop[X86].verdict == "REJECT" and not d.early_stop[X86].stopped_by
    assert (d.early_stop[ARM].stopped_by, d.early_stop[ARM].looks, d.early_stop[ARM].samples_used) == (X86, 1, 0)
    assert [c.name for c in d.checks if c.device_class == ARM] == ["stopped"]
    assert {c.name for c in d.checks if c.device_class == X86 and not c.passed} >= {"text_iou_difference"}
    left = client.containers.list(all=True, filters={"label": f"{janitor.OWNER_PID}={os.getpid()}"})
    assert not left, [c.name for c in left]          # arm64's killed container is gone
