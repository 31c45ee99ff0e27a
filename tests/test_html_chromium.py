"""The HTML report opens in headless Chromium without script errors, its figures render, and
its failure review works: the kind filter, an attempt opened (collapsed by default) shows its
transcript as a conversation beside a passing attempt of the same task, an anchor opens its
attempt, and what the agent wrote -- script and markup included -- is shown as text, never run.

The run is real: the refunds suite's own agent (refundbot), wrapped so that after it the
transcript and stdout get a few lines of markup injection, and one task exits 1 (crashed), so
the review has two failure kinds."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tests.conftest import missing

pytestmark = pytest.mark.docker

TASKS = "duplicate-charge,goodwill-above-threshold"  # with --seed 0, 3 trials: ✗✓✗ and ✗✗✗
INJECT = "</script><script>window.pwned=1</script>"
IMG = "<img src=x onerror=window.pwned=2>"
WRAPPER = f"""
import json, os, subprocess, sys
rc = subprocess.call(["refundbot"])
with open(os.environ["HARNESS_TRANSCRIPT"], "a") as f:
    f.write(json.dumps({{"role": "assistant", "content": "last word {INJECT}",
                        "tool_calls": [{{"function": {{"name": "note", "arguments": json.dumps({{"html": "{IMG}"}})}}}}]}}) + "\\n")
    f.write("{INJECT}{IMG.replace('pwned=2', 'pwned=3')}\\n")
print("{IMG.replace('pwned=2', 'pwned=4')}")
sys.exit(1 if os.environ["HARNESS_TASK_ID"] == "goodwill-above-threshold" else rc)
"""
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
    r = subprocess.run([sys.executable, "-m", "harness", "run", "--suite", "refunds", "--tasks", TASKS, "--trials", "3", "--k", "1,3",
                        "--seed", "0", "--agent-cmd", shlex.join(["python3", "-c", WRAPPER]), "--db", db, "--json"],
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
    assert 'data-figures-done="1"' in dom, "the figures were drawn once the compressed bundle was unpacked"
    assert report_html.stat().st_size < 3 * 2**20, "plotly ships compressed (4.8 MB raw)"
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


# Appended to a copy of the page: drives the review as a user would (real DOM events: a click
# on a filter checkbox, an attempt opened), then writes what it saw to <html data-test=...>.
DRIVER = """<script>
(function () {
  var out = {};
  function texts(els) { return Array.prototype.map.call(els, function (e) { return e.textContent; }); }
  function step() {
    var root = document.querySelector('.review');
    if (!root || root.getAttribute('data-ready') !== '1') { setTimeout(step, 50); return; }
    var all = root.querySelectorAll('details.rattempt');
    out.collapsed = Array.prototype.filter.call(all, function (d) { return !d.open; }).length;
    out.attempts = all.length;
    out.hash_open = location.hash ? document.getElementById(location.hash.slice(1)).open : null;
    out.kinds = Array.prototype.map.call(root.querySelectorAll('.review-filter input[data-kind]'), function (c) { return c.getAttribute('data-kind'); });
    var ws = root.querySelector('.review-filter input[data-kind="wrong_state"]');
    ws.click();
    out.unchecked = Array.prototype.map.call(all, function (d) { return [d.getAttribute('data-kind'), !d.hidden]; });
    out.count = root.querySelector('.review-count').textContent;
    ws.click();
    out.rechecked_hidden = Array.prototype.filter.call(all, function (d) { return d.hidden; }).length;
    var d = Array.prototype.filter.call(all, function (x) { return x.getAttribute('data-kind') === 'wrong_state' && x.querySelector('.side-pass'); })[0];
    out.msgs_before_open = d.querySelectorAll('.msg').length;
    d.querySelector('summary').click();
    setTimeout(function () {
      out.opened = d.open;
      out.fail_msgs = texts(d.querySelectorAll('.side-fail .msg'));
      out.pass_msgs = texts(d.querySelectorAll('.side-pass .msg'));
      out.fail_attempt = d.getAttribute('data-attempt');
      out.pass_attempt = d.querySelector('.side-pass').getAttribute('data-attempt');
      out.stdout = d.querySelector('.side-fail pre[data-file="stdout.txt"]').textContent;
      out.imgs = document.querySelectorAll('img').length;
      out.pwned = typeof window.pwned;
      out.errors = window.__harnessErrors;
      document.documentElement.setAttribute('data-test', JSON.stringify(out));
    }, 300);
  }
  step();
})();
</script>
"""


def test_failure_review_filters_expands_and_shows_injections_as_text(report_html, tmp_path):
    page = report_html.read_text(encoding="utf-8")
    assert INJECT not in page and "<img" not in page, "agent text reaches the page only escaped"
    crashed = re.search(r'<details class="rattempt" id="(attempt-\d+)" data-kind="crashed"', page)
    assert crashed, "the wrapper's exit 1 made goodwill-above-threshold crash"
    driven = tmp_path / "driven.html"
    driven.write_text(page.replace("</body>", DRIVER + "</body>"), encoding="utf-8")
    dom = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", driven.as_uri() + "#" + crashed.group(1)],
        capture_output=True, text=True, timeout=120,
    ).stdout
    m = re.search(r'<html[^>]*data-test="([^"]*)"', dom)
    assert m, "the driver did not finish (the review never became ready)"
    got = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    assert got["errors"] == []
    # collapsed by default, except the one the URL's anchor opened
    assert got["attempts"] >= 4 and got["collapsed"] == got["attempts"] - 1 and got["hash_open"] is True
    # the kind filter: wrong_state unchecked hides exactly the wrong_state attempts
    assert got["kinds"] == ["wrong_state", "crashed"]
    assert {k for k, visible in got["unchecked"] if visible} == {"crashed"}
    assert {k for k, visible in got["unchecked"] if not visible} == {"wrong_state"}
    assert got["count"].startswith(f"{sum(v for _, v in got['unchecked'])} of {got['attempts']} ")
    assert got["rechecked_hidden"] == 0
    # opened: the transcript as a conversation (refundbot's own lines), beside a passing attempt's
    assert got["msgs_before_open"] == 0 and got["opened"]
    assert any(x.startswith("thought step 2 · ") and x.endswith("Read the ticket and work out what the customer wants.") for x in got["fail_msgs"]), got["fail_msgs"][:4]
    assert any(x.startswith("tool call step 4 · ") and x.endswith("refunds policy") for x in got["fail_msgs"])
    assert any(x.startswith("tool result · exit 0 step 5 · ") and '"refund_window_days": 30' in x for x in got["fail_msgs"])
    assert got["pass_attempt"] != got["fail_attempt"]
    assert any(x.endswith("Read the ticket and work out what the customer wants.") for x in got["pass_msgs"])
    # what the agent wrote is text: the injection strings are there, verbatim, and nothing ran
    assert any(x == f"assistantlast word {INJECT}" for x in got["fail_msgs"]), got["fail_msgs"][-3:]
    assert any(x.startswith("tool call note") and IMG in x for x in got["fail_msgs"])
    assert any(x.startswith("line (not JSON)") and INJECT in x and "pwned=3" in x for x in got["fail_msgs"])
    assert "<img src=x onerror=window.pwned=4>" in got["stdout"]
    assert got["pwned"] == "undefined" and got["imgs"] == 0
    assert "<img" not in dom and "<script>window.pwned" not in dom


# A transcript line an agent wrote to hurt the page: JSON nested far deeper than anyone reads.
# JSON.stringify(v, null, 2) made 271 M characters of 4,400 levels (quadratic indentation) and
# threw a RangeError at 20,000, after which the attempt's other boxes stayed empty.
DEEP_DRIVER = """<script>
(function () {
  function step() {
    var root = document.querySelector('.review');
    if (!root || root.getAttribute('data-ready') !== '1') { setTimeout(step, 50); return; }
    var d = root.querySelector('details.rattempt');
    d.querySelector('summary').click();
    setTimeout(function () {
      var msgs = Array.prototype.map.call(d.querySelectorAll('.side-fail .msg'), function (e) { return e.textContent; });
      document.documentElement.setAttribute('data-test', JSON.stringify({
        msgs: msgs.map(function (m) { return m.length; }), heads: msgs.map(function (m) { return m.slice(0, 60); }),
        marked: msgs.map(function (m) { return /nested too deep to show|cut here/.test(m); }),
        stdout: d.querySelector('.side-fail pre[data-file="stdout.txt"]').textContent,
        errors: window.__deepErrors}));
    }, 300);
  }
  step();
})();
</script>
"""


def test_a_deeply_nested_transcript_line_is_cut_not_hung_and_the_other_boxes_fill(tmp_path):
    from harness.report.build import build_report
    from harness.report.render import render_html
    from harness.report.review import review_sections
    from tests.test_review import make_run

    exe = chromium()
    run, atts = make_run({"t": "W✓"}, tmp_path)
    lines = [  # all three inside the review's 64 KiB of transcript
        json.dumps({"type": "observation", "output": "[" * 20000 + "]" * 20000}),  # a tool's output the page parses
        '{"type": "weird", "v": ' + "[" * 4400 + "1" + "]" * 4400 + "}",  # the line itself
        '{"type": "odd", "v": ' + '{"a":' * 1500 + "1" + "}" * 1500 + "}",
        # names the prototype has, an argv item that is not a string, a lone surrogate the page parses
        '{"type": "constructor"}', '{"type": "tool_call", "argv": ["ls", {"toString": 1}]}',
        '{"role": "user", "content": "lone \\ud800 x", "__proto__": 1}',
        # a bidi override and a control that would reorder or hide what the reviewer reads; JSON
        # that is not an object; a number JSON.stringify makes null; a null argv item
        '{"role": "assistant", "content": "a\\u202eb\\u0007c"}', '42',
        '{"type": "tool_result", "exit": 1e400, "output": "x"}', '{"type": "tool_call", "argv": ["rm", null]}',
    ]
    (Path(atts[0].artifacts) / "transcript.jsonl").write_text("\n".join(lines) + "\n")
    (Path(atts[0].artifacts) / "stdout.txt").write_text("the stdout box still fills\n")
    rep = build_report(run, atts).data()
    page = render_html(rep, extra_sections=review_sections(rep, atts))
    driven = tmp_path / "deep.html"
    hook = "<script>window.__deepErrors = []; window.addEventListener('error', function (e) { window.__deepErrors.push(String(e.message)); });</script>"
    assert page.count("<head>") == 1
    driven.write_text(page.replace("<head>", "<head>" + hook).replace("</body>", DEEP_DRIVER + "</body>"), encoding="utf-8")
    dom = subprocess.run([exe, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", driven.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<html[^>]*data-test="([^"]*)"', dom)
    assert m, "the driver did not finish: the page hung or threw on the nested line"
    got = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    assert got["errors"] == []
    assert got["stdout"] == "the stdout box still fills\n"
    assert len(got["msgs"]) == 10, got["heads"]
    # every message is shown, bounded (100,000 characters and a note), and says where it was cut
    assert all(n < 101_000 for n in got["msgs"]), got["msgs"]
    assert got["marked"] == [True, True, True] + [False] * 7, got["heads"]
    kinds = ("observation", "weird", "odd", "constructor", "tool call", "user")
    assert [h[:len(w)] for h, w in zip(got["heads"], kinds)] == list(kinds), got["heads"]
    assert got["heads"][4] == 'tool callls "{\\n  \\"toString\\": 1\\n}"', got["heads"][4]  # the item as JSON, quoted
    assert got["heads"][5] == "userlone \ufffd x", got["heads"][5]  # and the DOM could be saved (--dump-dom)
    assert got["heads"][6:] == ["assistanta\ufffdb\ufffdc", "line (JSON, not an object)42", "tool result · exit Infinityx",
                                "tool callrm null"], got["heads"][6:]
