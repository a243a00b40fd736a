"""The report opens in a real browser (Debian's headless Chromium driven by playwright) from a file, offline:
every table fits a 1400 px window, the plotly plots render with their data, hover and axes name versions,
and a REJECT cell of the verdict matrix leads to its decision page and its explain table."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tiergate.registry.report_data import build_drift_report
from tiergate.reports.html import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WIDTH = 1400

pytestmark = [pytest.mark.chromium, pytest.mark.docker, pytest.mark.emulated, pytest.mark.slow]


@pytest.fixture(scope="module")
def report(filled, tmp_path_factory) -> tuple[Path, dict]:
    registry, _ = filled
    data = build_drift_report(registry, "digits")
    html_path, _ = write_report(data, tmp_path_factory.mktemp("report") / "report")
    return html_path, data


@pytest.fixture(scope="module")
def browser():
    import playwright.sync_api as playwright     # the chromium marker checked it is there
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser, report):
    """The report at 1400 px; any request that is not a file:// one fails the test (offline page)."""
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    fetched: list[str] = []
    context.route("**/*", lambda route: (fetched.append(route.request.url), route.abort())
                  if not route.request.url.startswith("file://") else route.continue_())
    page = context.new_page()
    page.goto(report[0].as_uri())
    page.wait_for_selector("#plot-cross-tier .main-svg")
    yield page
    context.close()
    assert fetched == []


def test_every_column_of_every_table_fits_1400px(page, tmp_path):
    from matplotlib.image import imread

    shot = tmp_path / "report-1400.png"
    page.screenshot(path=str(shot), full_page=True)
    cells = page.evaluate("""() => [...document.querySelectorAll('th, td')].map(e => {
        const r = e.getBoundingClientRect();
        return {table: e.closest('table').id, text: e.textContent.slice(0, 40), left: r.left, right: r.right,
                width: r.width, clipped: e.scrollWidth > e.clientWidth + 1};
    })""")
    tables = {c["table"] for c in cells}
    assert {"table-verdicts", "table-tier-cortex-a", "table-tier-x86-server", "table-cross-tier"} <= tables
    assert len(cells) > 150
    outside = [c for c in cells if c["right"] > WIDTH or c["left"] < 0 or c["width"] <= 0 or c["clipped"]]
    assert outside == []
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH     # no horizontal scrolling at all
    pixels = imread(shot)[..., :3]
    assert pixels.shape[1] == WIDTH
    rgb = (pixels * 255).astype(np.uint32)
    assert len(np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])) > 50   # plots painted
    reject = np.mean((np.abs(pixels[..., 0] - 0xf6 / 255) < 0.01) & (np.abs(pixels[..., 1] - 0xc9 / 255) < 0.01))
    assert reject > 0                                                          # the REJECT cells' colour


def test_plotly_plots_render_with_versions_on_the_axis_and_in_the_hover(page, report):
    _, data = report
    labels = [a["label"] for a in data["artifacts"]]
    shorts = [a["short"] for a in data["artifacts"]]
    assert labels == ["v1", "v2", "v3"]
    for plot in ("plot-tier-cortex-a", "plot-tier-x86-server", "plot-cross-tier"):
        assert page.locator(f"#{plot} .main-svg").count() >= 1
        traces = page.evaluate(f"document.getElementById('{plot}').data.map(t => (t.y || t.z).length)")
        assert traces and all(n > 0 for n in traces)
    ticks = page.locator("#plot-tier-x86-server .xaxislayer-above .xtick text").all_text_contents()
    assert ticks and set(ticks) <= set(labels) and not any(s[:6] in t for t in ticks for s in shorts)
    points = page.locator("#plot-tier-x86-server .scatterlayer .trace .points path")
    assert points.count() >= 6
    x86_rows = data["tiers"]["x86-server"]["rows"]
    seen = []
    for i in range(points.count()):
        points.nth(i).hover(force=True)
        hover = page.locator("#plot-tier-x86-server .hoverlayer").text_content()
        if "version" in hover:
            seen.append(hover)
    assert seen
    for hover in seen:
        row = next(r for r in x86_rows if f"version {r['version']}" in hover and r["short"] in hover)
        assert row["registered_at"] in hover


def test_a_reject_cell_leads_to_its_decision_and_explain_table(page, report, filled):
    _, made = filled
    _, data = report
    decision_id = made["runs"]["v1"]["decision_id"]
    cell = page.locator('#table-verdicts td[data-verdict="reject"]').first
    assert cell.get_attribute("data-decision") == str(decision_id)
    cell.locator("a.verdict-link").click()
    page.wait_for_load_state()
    assert page.url.endswith(f"decisions/decision-{decision_id}.html")
    assert page.locator("#verdict").text_content() == "REJECT"
    assert page.locator("#artifact-sha").text_content() == made["shas"]["v1"]
    failing = page.locator("#table-checks tr.fail").all_text_contents()
    assert any("accuracy_ratio" in row for row in failing)
    page.locator("#explain-link").click()
    page.wait_for_load_state()
    assert page.url.endswith(f"decisions/explain-{decision_id}.html")
    first = made["explained"].targets["x86_64-cpu-onnxruntime"].first_divergent
    assert first and page.locator("p", has_text="first divergent").first.text_content() == f"first divergent: {first}"
    assert page.locator("tr.first td").first.text_content() == first      # the explain table's marked row
    page.locator("#back").click()                                          # and back to the decision
    assert page.url.endswith(f"decisions/decision-{decision_id}.html")
