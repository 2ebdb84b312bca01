"""The shadow HTML report in a real headless Chromium: it renders its tables, charts and inline
images from one file, with no server, no network and no console error.

Chromium comes from Debian's packages (``apt-get install chromium``); without it the test
skips and says so.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime.cli import main
from test_shadow import perturbed_copy, subset

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    if not CHROMIUM.exists():
        pytest.skip(f"no browser: {CHROMIUM} is absent (Debian: apt-get install chromium)")
    profile = tmp_path / f"profile{len(list(tmp_path.glob('profile*')))}"
    return subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
                           "--v=0", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(digits_artifact, tmp_path_factory) -> tuple[Path, dict]:
    """A shadow of digits against its permuted-weights twin on 40 held-out images: flips,
    failures of agreement, inline images."""
    tmp = tmp_path_factory.mktemp("shadow-report")
    broken = perturbed_copy(digits_artifact, tmp / "broken")
    page = tmp / "report.html"
    res = CliRunner().invoke(main, ["shadow", str(digits_artifact), str(broken), str(subset(tmp)), "--report",
                                    str(page), "--json", "--quiet", "--worst", "8"])
    assert res.exit_code == 0, res.output
    return page, json.loads(res.stdout)


def test_the_report_renders_its_tables_and_charts_in_chromium(report, tmp_path):
    page, summary = report
    text = page.read_text()
    assert not re.search(r"(?:src|href)=\"(?!data:)", text), "the page refers to something outside itself"
    assert re.findall(r"https?://[^\"' ]+", text) == ["http://www.w3.org/2000/svg"] * text.count("<svg")
    proc = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert dom.count('<tr class="item">') == len(summary["worst"]) == 8
    assert dom.count("<svg") == 2 and dom.count('class="bar"') > 10 and "<line" in dom
    assert 'id="flip-matrix"' in dom and dom.count('class="num flip"') == 90          # 10 x 10 off the diagonal
    flips = sum(f["count"] for f in summary["flips"])
    assert flips > 0 and 'id="flips"' in dom
    assert dom.count('<img class="in"') == 8 and 'src="data:image/png;base64,' in dom
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln or "net::ERR" in ln]
    assert console == [], console


def test_the_report_screenshot_is_a_page_not_a_blank(report, tmp_path):
    from PIL import Image

    page, _ = report
    shot = tmp_path / "report.png"
    proc = chromium(tmp_path, "--window-size=1100,1400", f"--screenshot={shot}", page.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1100, 1400)
    colours = img.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50                                                   # text, charts, images
    # both sides' bar colours are on the page (the latency chart drew them)
    px = {rgb for _, rgb in colours}
    assert any(abs(r - 0x1f) + abs(g - 0x77) + abs(b - 0xb4) < 120 and b > r + 60 for r, g, b in px)
    assert any(r > 200 and 100 < g < 200 and b < 120 for r, g, b in px)
