"""The HTML report's runtime-graph table: op counts per device class, the CPU each class's runtime saw, and the
classes whose runtime refused the artifact (rows only when some class has them)."""

from __future__ import annotations

from tiergate.reports.html import runtime_table


def _entry(**classes) -> dict:
    return {"short": "abc123", "device_classes": classes}


def test_the_cpu_row_names_what_each_runtime_saw_and_the_refused_row_the_refusal():
    page = runtime_table(_entry(
        avx2={"level": "all", "ops": {"Conv": 3}, "cpu": {"model": "Haswell <noTSX>", "features": ["avx2", "fma"]}},
        arm={"level": "all", "ops": {"Conv": 3, "Add": 1}, "ok": False, "error": "opset 27 > 26"}))
    assert '<td class="l">cpu</td><td>Haswell &lt;noTSX&gt;: avx2 fma</td><td>' in page      # escaped, per class
    assert '<td class="l">refused</td><td></td><td>opset 27 &gt; 26</td></tr>' in page
    assert page.index(">cpu<") < page.index("<code>Add</code>") < page.index(">refused<")


def test_no_cpu_or_refused_row_when_no_class_has_one():
    page = runtime_table(_entry(x86={"level": "basic", "ops": {"Relu": 2}}))
    assert ">cpu<" not in page and ">refused<" not in page and "<code>Relu</code></td><td>2</td>" in page


def test_a_tier_an_early_decision_stopped_says_so_in_the_verdict_matrix():
    """A decision whose arm64 tier was stopped by x86's final REJECT: the matrix cell of arm64 carries the gate's
    verdict, no failing check of its own, and the reason it was not judged, which the page shows."""
    from tiergate.registry.report_data import verdict_matrix
    from tiergate.reports.html import verdict_table

    why = "stopped before its first look: x86_64-cpu-onnxruntime's REJECT is final"
    checks = [{"tier": "x86-server", "name": "accuracy_ratio", "label": "accuracy_ratio", "outcome": "fail",
               "detail": ""},
              {"tier": "cortex-a", "name": "stopped", "label": "stopped", "outcome": "inconclusive", "detail": why}]
    artifacts = [{"sha256": "a" * 64, "short": "aaaaaaaa", "label": "v2", "family": "int8/onnx",
                  "registered_at": "2026-11-27T00:00:00+00:00"}]
    decisions = [{"id": 7, "artifact_sha": "a" * 64, "verdict": "reject", "explained": False,
                  "tiers": ["x86-server", "cortex-a"], "checks": checks}]
    matrix = verdict_matrix(artifacts, decisions, ["x86-server", "cortex-a"])
    cells = matrix["rows"][0]["cells"]
    assert cells["x86-server"]["failed"] == ["accuracy_ratio"] and not cells["x86-server"]["stopped"]
    assert cells["cortex-a"]["failed"] == [] and cells["cortex-a"]["stopped"] == why
    page = verdict_table({"verdicts": matrix, "artifacts": artifacts})
    assert page.count('class="check stopped"') == 1 and "stopped, not judged</span>" in page   # cortex-a only
    assert f'title="{why.replace(chr(39), "&#x27;")}"' in page
