"""The HTML report opens in headless Chromium without script errors and its figures render."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.conftest import missing

pytestmark = pytest.mark.docker

PROBE = str(Path(__file__).parent / "suites" / "probe")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--virtual-time-budget=8000",
]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        missing("chromium is missing; `make test` installs it (apt-get install chromium)")
    return exe


@pytest.fixture(scope="module")
def report_html(docker_client, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("html")
    env = {**os.environ, "HARNESS_HOME": str(d / "home")}
    db = f"sqlite:///{d}/h.db"
    r = subprocess.run([sys.executable, "-m", "harness", "run", "--suite", PROBE, "--trials", "3", "--db", db, "--json"],
                       capture_output=True, text=True, env=env, cwd=d, timeout=300)
    assert r.returncode == 0, r.stderr
    out = d / "report.html"
    r = subprocess.run([sys.executable, "-m", "harness", "report", "last", "--format", "html", "--out", str(out), "--db", db],
                       capture_output=True, text=True, env=env, cwd=d, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def test_opens_without_errors_and_renders_figures(report_html, tmp_path):
    dom = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", report_html.as_uri()],
        capture_output=True, text=True, timeout=120,
    ).stdout
    m = re.search(r'<html[^>]*data-errors="([^"]*)"', dom)
    assert m, "the page's load handler did not run"
    assert json.loads(m.group(1).replace("&quot;", '"')) == []
    figs = int(re.search(r'data-figures="(\d+)"', dom).group(1))
    assert figs >= 3, "pass-vs-k, grid and saturation figures drawn as SVG"
    for fig in ("fig-pass-vs-k", "fig-grid", "fig-saturation"):
        assert f'id="{fig}"' in dom


def _png_pixels(path: Path) -> tuple[int, int, int, bytes]:
    """Decode an 8-bit RGB/RGBA PNG with the stdlib: (width, height, bytes per pixel, pixels)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h, depth, ctype = struct.unpack(">IIBB", data[16:26])
    assert depth == 8 and ctype in (2, 6), (depth, ctype)
    idat, pos = b"", 8
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    bpp = 4 if ctype == 6 else 3
    stride = w * bpp
    out = bytearray(h * stride)
    prev = bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return w, h, bpp, bytes(out)


def test_screenshot_shows_the_figures(report_html, tmp_path):
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1300,2600", f"--screenshot={shot}", report_html.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.exists()
    w, h, bpp, px = _png_pixels(shot)
    assert (w, h) == (1300, 2600)
    # the outcome grid paints pass (green #2e7d32) and wrong_state (red #c62828) cells
    colors = {px[i:i + 3] for i in range(0, len(px), bpp * 97)}
    assert bytes((0x2E, 0x7D, 0x32)) in colors, "no pass-green cells seen"
    assert bytes((0xC6, 0x28, 0x28)) in colors, "no wrong_state-red cells seen"
    assert len(colors) > 20
