"""The HTML report opened in headless Chromium (make test-browser): the tiers table is there,
and at 1280×800 the verdict and the setting are on the first screen with nothing to scroll
sideways (a layout probe reads the boxes the browser laid out; a screenshot is taken).

Chromium is installed when missing (scripts/browser.sh, apt-get); when it cannot be, the test
fails saying so — it never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.mockserver import REPO, start_mock
from tests.report_helpers import Page, ladder_row, write_run
from tests.tier_helpers import FAST, open_gate, run_dir

pytestmark = pytest.mark.browser


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    setup = subprocess.run(
        ["bash", str(REPO / "scripts" / "browser.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail(
            "headless Chromium is needed to open the HTML report and could not be "
            f"installed:\n{setup.stdout[-1500:]}{setup.stderr[-1500:]}\n"
            "Install Debian's chromium (apt-get install chromium) and rerun: make test-browser"
        )
    return found


def _headless(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done


def test_the_report_renders_in_headless_chromium(cli, isolated: Path) -> None:
    chromium = _chromium()
    with start_mock(ttft_s=0.002, per_token_s=0.004, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url)
        ladder = cli("ladder", "--json")
    assert ladder.code == 0, ladder.err
    run = run_dir(isolated, ladder.json["run_id"])
    assert cli("report", str(run), "--html", "--timeline", "4", "--no-plot").code == 0
    url = (run / "report.html").resolve().as_uri()

    dom = Page(_headless(chromium, isolated / "profile", "--dump-dom", url).stdout)
    rows = dom.body_rows("tiers")  # the table as the browser built it, not as the file says
    assert [r[0] for r in rows] == ["1", "2", "4", "8"]
    verdict = dom.rows["tiers"][0].index("verdict")  # latency columns may follow it
    assert [r[verdict] for r in rows] == ["pass", "pass", "pass", "fail"]
    assert dom.id_text["verdict-word"] == "passed"
    assert dom.count("rect", "bar") == 8  # batch 4, two rounds

    blank = isolated / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>", "utf-8")
    shots = []
    for page in (url, blank.resolve().as_uri()):
        shot = isolated / f"shot{len(shots)}.png"
        _headless(
            chromium,
            isolated / "profile",
            "--hide-scrollbars",
            "--window-size=1280,1600",
            f"--screenshot={shot}",
            page,
        )
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert int.from_bytes(data[16:20], "big") == 1280  # IHDR width: the window was drawn
        shots.append(len(data))
    assert shots[0] > 10 * shots[1], f"the report drew little more than a blank page: {shots}"


SCREEN = (1280, 800)
# Injected into a copy of the report (the report itself has no script): the laid-out boxes of
# the elements that must be on the first screen, the viewport, and how wide the page became.
_PROBE = """<script>
(function () {
  var out = {width: innerWidth, height: innerHeight,
             page_width: document.documentElement.scrollWidth, boxes: {}, overflow: []};
  IDS.forEach(function (id) {
    var e = document.getElementById(id);
    if (e) { var r = e.getBoundingClientRect(); out.boxes[id] = [r.left, r.top, r.right, r.bottom]; }
  });
  document.querySelectorAll(".scroll").forEach(function (e) {
    var folded = e.closest("details:not([open])");  // opened only by whoever wants every column
    if (!folded && e.scrollWidth > e.clientWidth + 1) {
      out.overflow.push(e.firstElementChild ? e.firstElementChild.id : "?");
    }
  });
  var p = document.createElement("pre"); p.id = "probe"; p.textContent = JSON.stringify(out);
  document.body.appendChild(p);
})();
</script>"""


def _layout(chromium: str, profile: Path, report: Path, ids: list[str]) -> dict[str, Any]:
    probe = report.with_name(f"probe-{report.name}")
    script = _PROBE.replace("IDS", json.dumps(ids))
    probe.write_text(report.read_text("utf-8").replace("</body>", script + "</body>"), "utf-8")
    dom = _headless(
        chromium,
        profile,
        "--hide-scrollbars",
        f"--window-size={SCREEN[0]},{SCREEN[1]}",
        "--dump-dom",
        probe.resolve().as_uri(),
    ).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, f"the layout probe did not run: {dom[-500:]}"
    data: dict[str, Any] = json.loads(found.group(1).replace("&quot;", '"'))
    return data


def _first_screen(layout: dict[str, Any], ids: list[str]) -> None:
    """Each element is laid out, wholly inside the 1280×800 first screen; nothing scrolls
    sideways (neither the page nor a visible table)."""
    assert layout["width"] == SCREEN[0], layout
    bottom = min(layout["height"], SCREEN[1])
    for ident in ids:
        box = layout["boxes"].get(ident)
        assert box, f"#{ident} is not in the page: {layout}"
        left, top, right, low = box
        assert 0 <= top < low <= bottom and 0 <= left < right <= SCREEN[0], (
            f"#{ident} is not on the first screen (box {box}, screen {SCREEN}): {layout}"
        )
    assert layout["page_width"] <= SCREEN[0], f"the page scrolls sideways: {layout}"
    assert layout["overflow"] == [], f"tables that scroll sideways: {layout['overflow']}"


def _screenshot(chromium: str, profile: Path, report: Path) -> Path:
    """report.png at 1280×800 (kept beside the report; HTML_SCREENSHOT_DIR copies it out)."""
    shot = report.with_suffix(".png")
    _headless(
        chromium,
        profile,
        "--hide-scrollbars",
        f"--window-size={SCREEN[0]},{SCREEN[1]}",
        f"--screenshot={shot}",
        report.resolve().as_uri(),
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    size = (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big"))
    assert size == SCREEN, f"the screenshot is {size}, not {SCREEN}"
    keep = os.environ.get("HTML_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / f"{report.parent.name}-{shot.name}")
    return shot


ANSWER = ["verdict-word", "setting-at", "setting-throughput", "setting-latency", "setting-headroom"]


def test_the_verdict_and_the_setting_are_on_the_first_screen(cli, isolated: Path) -> None:
    """A real ladder (batch 8 fails) and a real rate sweep on the mock, at 1280×800."""
    chromium = _chromium()
    with start_mock(ttft_s=0.002, per_token_s=0.004, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url, FAST + "[sweep]\nlevel_s = 0.6\nrepeats = 1\n")
        ladder = cli("ladder", "--json")
        sweep = cli("sweep", "--rates", "5,20", "--json")
    assert ladder.code == 0 and sweep.code == 0, ladder.err + sweep.err
    for result in (ladder, sweep):
        run = run_dir(isolated, result.json["run_id"])
        assert cli("report", str(run), "--html", "--no-plot").code == 0
        report = run / "report.html"
        _first_screen(_layout(chromium, isolated / "profile", report, ANSWER), ANSWER)
        _screenshot(chromium, isolated / "profile", report)


def test_report_a_b_shows_both_settings_on_the_first_screen(cli, isolated: Path) -> None:
    chromium = _chromium()
    rows = [ladder_row(b, 4.0 * b) for b in (1, 2, 4, 8, 16, 32)]
    rows[-1] = ladder_row(32, 60.0, verdict="fail")
    write_run(isolated, "a", "ladder", rows, summary={"last_passing": {"batch_size": 16}})
    write_run(isolated, "b", "ladder", rows[:-1], summary={"last_passing": {"batch_size": 16}})
    assert cli("report", "runs/a", "runs/b", "--html").code == 0
    report = isolated / "runs/b/compare-a.html"
    ids = [f"{what}-{side}" for side in "ab" for what in ("verdict", "setting")]
    layout = _layout(chromium, isolated / "profile", report, [*ids, "comparison-summary"])
    _first_screen(layout, ids)
    assert layout["overflow"] == []  # the A → B table fits 1280 px
    _screenshot(chromium, isolated / "profile", report)


def test_the_probe_fails_a_report_whose_answer_is_below_the_fold(isolated: Path) -> None:
    """The check itself: the same answer pushed down by a screen of text is caught."""
    chromium = _chromium()
    report = isolated / "tall.html"
    filler = "<p>" + "configuration line<br>" * 60 + "</p>"
    report.write_text(
        f'<!DOCTYPE html><html><body>{filler}<p id="verdict-word">passed</p></body></html>',
        "utf-8",
    )
    layout = _layout(chromium, isolated / "profile", report, ["verdict-word"])
    with pytest.raises(AssertionError, match="not on the first screen"):
        _first_screen(layout, ["verdict-word"])
