"""JUnit XML and Markdown summary of a decision."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from tiergate.gate import evaluate
from tiergate.policy import load_policy
from tiergate.reports.junit import write_junit
from tiergate.reports.markdown import render_markdown, write_summary


@pytest.fixture
def decision(classifier_data, device_classes, make_outcome, to_probs):
    logits, labels = classifier_data
    rng = np.random.default_rng(1)
    reference = {"x86": make_outcome("x86", {"probs": to_probs(logits)}),
                 "arm": make_outcome("arm", {"probs": to_probs(logits + 1e-6)}, latency_ms=30, emulated=True)}
    coarse = (np.round(to_probs(logits) * 4) / 4).astype(np.float32)
    candidate = {"x86": make_outcome("x86", {"probs": coarse}, seed=2),
                 "arm": make_outcome("arm", None, status="failed", reason="qemu: illegal | instruction")}
    incumbent = {"x86": make_outcome("x86", {"probs": to_probs(logits + rng.normal(0, 0.1, logits.shape))})}
    return evaluate(candidate, reference, device_classes, load_policy(), labels, incumbent, quantized=True)


@pytest.fixture
def promoted(classifier_data, device_classes, make_outcome, to_probs):
    logits, labels = classifier_data
    reference = {"x86": make_outcome("x86", {"probs": to_probs(logits)})}
    candidate = {"x86": make_outcome("x86", {"probs": to_probs(logits + 1e-4)}, seed=1)}
    return evaluate(candidate, reference, device_classes, load_policy(), labels, quantized=True)


def test_junit_has_one_testcase_per_check_per_device_class(decision, tmp_path):
    path = write_junit(decision, tmp_path / "out" / "gate.xml")
    root = ET.parse(path).getroot()
    cases = root.findall("./testsuite/testcase")
    failed = [c for c in decision.checks if not c.passed]
    assert root.tag == "testsuites" and int(root.get("tests")) == len(decision.checks) == len(cases)
    assert int(root.get("failures")) == len(failed) == len(root.findall("./testsuite/testcase/failure")) > 1
    for suite in root.findall("testsuite"):
        device_class = suite.get("name").removeprefix("tiergate.")
        mine = [c for c in decision.checks if c.device_class == device_class]
        assert int(suite.get("tests")) == len(mine) == len(suite.findall("testcase"))
        assert int(suite.get("failures")) == sum(not c.passed for c in mine)
        names = [case.get("name") for case in suite.findall("testcase")]
        assert names == [c.label for c in mine] and len(set(names)) == len(names)
    arm_run = root.find("./testsuite[@name='tiergate.arm']/testcase[@name='run']/failure")
    assert "qemu: illegal | instruction" in arm_run.get("message")
    assert {s.get("name") for s in root.findall("testsuite")} == {"tiergate.x86", "tiergate.arm"}


def test_junit_of_a_promotion_has_no_failures(promoted, tmp_path):
    root = ET.parse(write_junit(promoted, tmp_path / "gate.xml")).getroot()
    assert root.get("failures") == "0" and root.find(".//failure") is None
    assert len(root.findall(".//testcase")) == len(promoted.checks)


def test_markdown_summary_shows_verdict_tiers_and_reasons(decision):
    text = render_markdown(decision)
    assert text.startswith("## tiergate gate: ❌ REJECT")
    assert "### Tier `x86-server`" in text and "### Tier `cortex-a`" in text
    assert "### Why it was rejected" in text
    for check in decision.checks:
        assert f"`{check.label}`" in text
    reasons = text.split("### Why it was rejected")[1].split("###")[0]
    assert reasons.count("\n- ") == len(decision.reasons) == sum(not c.passed for c in decision.checks)
    assert "qemu: illegal \\| instruction" in text                   # pipes escaped inside tables
    assert "### A/B against the incumbent" in text
    for line in text.splitlines():
        if line.startswith("| `x86` | `sqnr_db[probs]`"):
            assert "❌ **fail**" in line and ">= 20" in line


def test_markdown_labels_emulated_latency(classifier_data, device_classes, make_outcome, to_probs):
    logits, _ = classifier_data
    reference = {"arm": make_outcome("arm", {"probs": to_probs(logits)}, latency_ms=30, emulated=True)}
    candidate = {"arm": make_outcome("arm", {"probs": to_probs(logits)}, latency_ms=31, emulated=True, seed=4)}
    text = render_markdown(evaluate(candidate, reference, device_classes, load_policy(), None))
    row = next(line for line in text.splitlines() if line.startswith("| `arm` | emulated"))
    assert "emulated (QEMU), not gated" in row and row.rstrip().endswith("| — |")     # no cost from emulation


def test_markdown_of_a_promotion(promoted):
    text = render_markdown(promoted)
    assert text.startswith("## tiergate gate: ✅ PROMOTE") and "Why it was rejected" not in text
    assert "❌" not in text


def test_write_summary_writes_markdown_and_json(decision, tmp_path):
    written = write_summary(decision, tmp_path / "report")
    assert written["markdown"].read_text() == render_markdown(decision)
    assert json.loads(written["json"].read_text())["verdict"] == "REJECT"
