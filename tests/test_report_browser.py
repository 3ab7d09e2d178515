"""The HTML report opened in headless Chromium, offline: the page renders, and plotly drew every plot.

Needs Debian's `chromium` package (`apt-get install -y chromium`); the test skips only when no chromium binary
can be found, and says so.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from runinfra_opt.report import render_html
from runinfra_opt.results import RunResults
from tests.report_fixtures import build_results, running

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed on this machine and could not be installed here (it needs "
    "`apt-get update && apt-get install -y chromium`, which make test runs where apt-get works)",
)


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        # Offline: any host name fails to resolve, so a page that needed the network would not render.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--virtual-time-budget=15000",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct colours in a sample of rows) of an 8-bit RGB(A) PNG, without any imaging library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    assert depth == 8
    assert colour_type in (2, 6)
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    colours: set[bytes] = set()
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):  # undo PNG filters (needed to read every row in order)
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            up_left = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else up_left)
                line[x] = (line[x] + pred) & 0xFF
        if y % 8 == 0:
            colours.update(bytes(line[i:i + 3]) for i in range(0, stride, channels * 4))
        previous = line
    return width, height, len(colours)


@pytest.mark.parametrize(("kind", "results", "plots"), [
    ("complete", build_results(), 4),
    ("running", running(), 3),  # no decision yet: the per-category plot says why instead
])
def test_html_report_renders_in_chromium(tmp_path: Path, kind: str, results: RunResults, plots: int) -> None:
    page = tmp_path / f"report-{kind}.html"
    page.write_text(render_html(results), encoding="utf-8")
    screenshot = tmp_path / f"report-{kind}.png"

    shot = run_chromium(tmp_path, f"--screenshot={screenshot}", "--window-size=1200,2400", page.as_uri())
    assert screenshot.is_file(), f"no screenshot: {shot.stderr[-2000:]}"
    width, height, colours = png_size_and_colours(screenshot)
    assert (width, height) == (1200, 2400)
    assert colours > 20, f"the screenshot looks blank ({colours} colours)"

    dom = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    # After plotly.js ran, each plot div carries the js-plotly-plot class and an SVG drawn inside it.
    drawn = re.findall(r'<div id="(plot-[a-z]+)" class="[^"]*js-plotly-plot', html)
    assert len(drawn) == plots, drawn
    assert html.count('class="main-svg"') >= 2 * plots  # plotly draws two stacked SVGs per plot
    assert "Plotly is not defined" not in html
    # Data reached the plots: traces (points, bars, boxes) exist in the drawn SVG.
    assert len(re.findall(r'class="(?:scatter|bars|boxes)"|class="trace', html)) >= plots
    assert "Winner: ngram-n2-k4" in html if kind == "complete" else "No decision yet" in html
