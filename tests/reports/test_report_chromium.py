"""The report opens in a real browser (Debian's headless Chromium) with its plots, from a file, offline."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tiergate.registry.report_data import build_drift_report
from tiergate.reports.html import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup installs it)")


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def page(filled, tmp_path_factory) -> Path:
    registry, _ = filled
    html_path, _ = write_report(build_drift_report(registry, "digits"), tmp_path_factory.mktemp("report") / "report")
    return html_path


@pytest.mark.docker
@pytest.mark.emulated
@pytest.mark.slow
def test_plots_are_in_the_rendered_dom(page, tmp_path):
    done = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    for svg_id in ("plot-tier-cortex-a", "plot-tier-x86-server", "plot-cross-tier"):
        match = re.search(f'<svg[^>]* id="{svg_id}".*?</svg>', dom, re.S)
        assert match, f"{svg_id} missing from the rendered DOM"
        assert match.group(0).count("<path") > 10  # axes, lines and markers were parsed as SVG
    # two tier tables, the cross-tier table, one runtime-graph table per gated artifact (three),
    # and a top-ops table per tier (the kit gates with --profile)
    assert dom.count("<table") == 8 and "tiergate drift report: digits" in dom
    assert dom.count('id="table-runtime-') == 3 and "What each tier's runtime executes" in dom


def test_the_page_paints_colour(page, tmp_path):
    from matplotlib.image import imread

    shot = tmp_path / "shot.png"
    done = _chromium(tmp_path, "--window-size=1300,2600", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    pixels = imread(shot)[..., :3]
    rgb = (pixels * 255).astype(np.uint32)
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    blueish = np.mean((pixels[..., 2] > 0.5) & (pixels[..., 0] < 0.3))  # matplotlib's C0 lines and markers
    assert len(colours) > 50 and blueish > 0.001
