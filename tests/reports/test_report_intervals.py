"""The drift report shows the recorded intervals: real gates on x86_64 and emulated arm64, recorded and rendered.

Three INT8-like candidates of a tiny classifier (its weights perturbed by more and more noise) are gated
by the orchestrator for real (containers on both tiers) against their FP32 reference, judged against
labels (top-1 accuracy ratio on its score interval over the discordant pairs), and recorded by
`orchestrator.record`. The
report's rows must carry the bounds the registry recorded, and the page must print exactly those
(accuracy as "93.8% [91.2, 95.9]", the check, the verdict).
"""

from __future__ import annotations

import os
import re
from html import unescape

import numpy as np
import onnxruntime as ort
import pytest
from report_kit import tiny_model

import gatekit
from tiergate import orchestrator
from tiergate.policy import load_policy
from tiergate.registry import Registry
from tiergate.registry.report_data import build_drift_report
from tiergate.registry.store import file_sha256
from tiergate.reports.html import render_html
from tiergate.targets import resolve

# 500 samples: at the reference's 92% accuracy, a candidate that agrees on every sample needs about 381 both
# get right to clear 0.99 (docs/policy.md); "close" agrees on all 500, "borderline" differs on 7, "far" on 21
N, FEATURES, CLASSES = 500, 6, 5
NOISE = {"close": 0.001, "borderline": 0.025, "far": 0.1}
CLASS_NAMES = ["x86_64-cpu-onnxruntime", "arm64-cpu-onnxruntime"]
pytestmark = [pytest.mark.docker, pytest.mark.emulated, pytest.mark.slow]


def _gate_and_record(registry: Registry, tmp_path) -> dict[str, str]:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, FEATURES)).astype(np.float32)
    w, b = rng.normal(size=(FEATURES, CLASSES)), rng.normal(scale=0.1, size=CLASSES)
    ref_path = tiny_model(tmp_path / "fp32.onnx", w, b)
    labels = ort.InferenceSession(str(ref_path)).run(None, {"x": x})[0].argmax(1)
    flip = rng.random(N) < 0.08
    labels[flip] = rng.integers(0, CLASSES, flip.sum())
    data = tmp_path / "eval.npz"
    np.savez(data, x=x, labels=labels.astype(np.int64))
    ref_sha = file_sha256(ref_path)
    registry.add_artifact(ref_path, sha256=ref_sha, model="tiny", format="onnx", precision="fp32",
                          fingerprint={"weights": "fp32"})
    shas = {}
    previous = os.environ.get("TIERGATE_HOME")
    os.environ["TIERGATE_HOME"] = str(tmp_path / "home")
    try:
        for name, scale in NOISE.items():
            path = tiny_model(tmp_path / f"{name}.onnx", w + rng.normal(scale=scale, size=w.shape), b)
            shas[name] = sha = file_sha256(path)
            registry.add_artifact(path, sha256=sha, model="tiny", format="onnx", precision="int8",
                                  fingerprint={"weights": name}, reference_sha=ref_sha, parent_sha=ref_sha)
            # every tier to its end: with early decision on, a tier's REJECT stops the others (no interval there)
            run = gatekit.gate(path, ref_path, data, resolve(CLASS_NAMES), load_policy(None), early_stop=False)
            orchestrator.record(registry, run)
    finally:
        if previous is None:
            os.environ.pop("TIERGATE_HOME", None)
        else:
            os.environ["TIERGATE_HOME"] = previous
    return shas


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("intervals")
    with Registry(f"sqlite:///{tmp_path / 'registry.db'}", tmp_path / "store") as registry:
        shas = _gate_and_record(registry, tmp_path)
        yield registry, shas


def _row_cells(page: str, tier: str, short: str) -> str:
    table = page[page.index(f'id="table-tier-{tier}"'):]
    table = table[:table.index("</table>")]
    return next(r for r in table.split("<tr") if f">{short}</code>" in r)


def test_rows_and_page_carry_the_recorded_intervals(gated):
    registry, shas = gated
    verdicts = {name: registry.decisions(artifact_sha=sha)[-1].verdict for name, sha in shas.items()}
    # the noise levels were chosen so that the page shows every outcome; the bounds below come from the registry
    assert set(verdicts.values()) == {"promote", "inconclusive", "reject"}, verdicts
    report = build_drift_report(registry, "tiny")
    page = render_html(report)
    seen_outcomes = set()
    for name, sha in shas.items():
        detail = registry.decisions(artifact_sha=sha)[-1].detail
        for tier in ("x86-server", "cortex-a"):
            row = next(r for r in report["tiers"][tier]["rows"] if r["artifact_sha"] == sha)
            recorded_acc = detail["metrics"][row["device_class"]]["accuracy"]["candidate"]
            acc = row["intervals"]["accuracy"]
            assert (acc["value"], acc["low"], acc["high"], acc["n"]) == (
                recorded_acc["value"], recorded_acc["low"], recorded_acc["high"], N)
            (check,) = [c for c in detail["checks"] if c["device_class"] == row["device_class"]
                        and c.get("interval")]
            (shown,) = row["intervals"]["checks"]
            assert (shown["low"], shown["high"], shown["value"]) == (
                check["interval"]["low"], check["interval"]["high"], check["interval"]["estimate"])
            assert shown["outcome"] == ("pass" if check["passed"] else
                                        "inconclusive" if check["inconclusive"] else "fail")
            seen_outcomes.add(shown["outcome"])

            cells = unescape(_row_cells(page, tier, row["short"]))
            text = (f"{100 * recorded_acc['value']:.1f}% [{100 * recorded_acc['low']:.1f}, "
                    f"{100 * recorded_acc['high']:.1f}]")
            assert f'<td class="accuracy">{text}</td>' in cells
            lo, hi = re.search(r"accuracy_ratio\[y\] [\d.]+ \[([\d.]+), ([\d.]+)\]", cells).groups()
            assert (float(lo), float(hi)) == pytest.approx((check["interval"]["low"], check["interval"]["high"]),
                                                          abs=5e-4)
            decision_id = registry.decisions(artifact_sha=sha)[-1].id     # the verdict links to its page
            assert (f'<span class="verdict"><a href="decisions/decision-{decision_id}.html">{verdicts[name]}</a>'
                    "</span>") in cells
            if shown["outcome"] == "inconclusive":
                assert f"needs ~{check['samples_needed']} samples" in cells
                assert check["samples_needed"] > N
    assert seen_outcomes == {"pass", "inconclusive", "fail"}
