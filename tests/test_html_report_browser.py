"""The HTML report opened in headless Chromium (make test-browser): the tiers table is there.

Chromium is installed when missing (scripts/browser.sh, apt-get); when it cannot be, the test
fails saying so — it never skips.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.mockserver import REPO, start_mock
from tests.report_helpers import Page
from tests.tier_helpers import open_gate, run_dir

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
