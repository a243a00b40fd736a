"""JUnit XML of a gate decision: one test case per check per device class, so any CI shows failures."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from tiergate.decision import Check, Decision


def junit_tree(decision: Decision) -> ET.ElementTree:
    """One <testsuite> per device class, one <testcase> per check; failed checks carry a <failure>."""
    failures = sum(not c.passed for c in decision.checks)
    root = ET.Element("testsuites", name="tiergate gate", tests=str(len(decision.checks)),
                      failures=str(failures), errors="0")
    for device_class, checks in _by_device_class(decision.checks).items():
        suite = ET.SubElement(root, "testsuite", name=f"tiergate.{device_class}", tests=str(len(checks)),
                              failures=str(sum(not c.passed for c in checks)), errors="0", skipped="0")
        properties = ET.SubElement(suite, "properties")
        ET.SubElement(properties, "property", name="tier", value=checks[0].tier)
        ET.SubElement(properties, "property", name="verdict", value=decision.verdict)
        _device_properties(properties, decision, device_class)
        for check in checks:
            _testcase(suite, check)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(decision: Decision, path: str | Path) -> Path:
    import io

    from tiergate.paths import write_new

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    junit_tree(decision).write(buffer, encoding="utf-8", xml_declaration=True)
    return write_new(path, buffer.getvalue())        # whole, never through a link planted there


def _testcase(suite: ET.Element, check: Check) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"tiergate.{check.tier}.{check.device_class}",
                         name=check.label, time="0")
    if not check.passed:
        failure = ET.SubElement(case, "failure", message=check.sentence(), type="gate")
        failure.text = check.detail or check.sentence()
    out = ET.SubElement(case, "system-out")
    out.text = f"value={check.value} threshold={check.op} {check.threshold}"


def _device_properties(properties: ET.Element, decision: Decision, device_class: str) -> None:
    """The device figures of each run as suite properties: candidate.peak_memory_mb, reference.load_ms, ..."""
    from tiergate.metrics.device import FIGURES

    m = decision.metrics.get(device_class)
    if m is None:
        return
    for side, figures in m.device.items():
        for fig in FIGURES:
            value = fig.value(figures)
            if value is not None:
                ET.SubElement(properties, "property", name=f"{side}.{fig.name}", value=f"{value:.6g}")
        if figures.emulated:
            ET.SubElement(properties, "property", name=f"{side}.device_figures", value="emulated")


def _by_device_class(checks: list[Check]) -> dict[str, list[Check]]:
    groups: dict[str, list[Check]] = {}
    for check in checks:
        groups.setdefault(check.device_class, []).append(check)
    return groups
