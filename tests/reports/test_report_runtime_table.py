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
