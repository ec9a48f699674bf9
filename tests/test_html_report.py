"""``calibrate report RUN --html``: one self-contained file with the tiers, plots and verdict."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.mockserver import start_mock
from tests.report_helpers import Page, ladder_row, sweep_row, write_run
from tests.tier_helpers import jsonl, open_gate, run_dir

XSS = "<script>alert('pwned')</script>"


def _external_refs(page: Page, html: str) -> list[str]:
    """Every attribute or CSS url() that would fetch something from outside the file."""
    refs = [
        v
        for _, attrs in page.tags
        for k, v in attrs.items()
        if k in ("src", "href", "xlink:href", "srcset", "data", "poster", "action")
    ]
    refs += re.findall(r"url\(([^)]*)\)", html) + re.findall(r"@import\s+[^;]+", html)
    return [r for r in refs if re.match(r"\s*['\"]?\s*(https?:)?//", r) or "@import" in r]


def test_a_real_ladder_report_has_its_tiers_verdict_incidents_and_timeline(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.004, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url)
        ladder = cli("ladder", "--json")
    assert ladder.code == 0, ladder.err
    run = run_dir(isolated, ladder.json["run_id"])
    result = cli("report", str(run), "--html", "--timeline", "8", "--json", "--no-plot")
    assert result.code == 0, result.err
    html_path = run / "report.html"
    assert result.json["html"] == str(html_path) and f"HTML report: {html_path}" in result.err
    html = html_path.read_text("utf-8")
    page = Page(html)
    rows = page.body_rows("tiers")
    verdict = page.rows["tiers"][0].index("verdict")
    assert [r[0] for r in rows] == ["1", "2", "4", "8"]  # batch column, as in the terminal
    assert [r[verdict] for r in rows] == ["pass", "pass", "pass", "fail"]
    assert page.id_text["verdict-word"] == "passed"
    details = page.id_text["verdict-details"]
    assert "stopped by failure" in details and "last passing batch size 4, concurrency 4" in details
    incidents = page.body_rows("incident-list")
    assert len(incidents) == 2 and all(r[1] == "oom" and r[3] == "500" for r in incidents)
    assert "CUDA out of memory" in incidents[0][2]
    tier8 = [r for r in jsonl(run / "records.jsonl") if r["batch_size"] == 8]
    assert page.count("rect", "bar") == len(tier8) == 8
    assert page.count("rect", "failed") == 2
    assert page.count("svg") >= 5  # four plots and the timeline, with or without matplotlib
    assert "model internlm-s2" in page.id_text["manifest"]
    assert _external_refs(page, html) == []
    assert page.count("script") == 0 and page.count("link") == 0


def test_values_are_escaped_not_run(cli, isolated: Path) -> None:
    rows = [ladder_row(1, 4.0), ladder_row(2, 7.0, verdict=XSS)]
    write_run(
        isolated,
        "r1",
        "ladder",
        rows,
        manifest={
            "config": {"target": {"model": XSS, "base_url": "http://x/v1"}},
            "command": ["calibrate", "ladder", "--model", XSS],
        },
        summary={
            "stopped_by": XSS,
            "last_passing": {"batch_size": 1},
            "workload": {"source": XSS},
            "notes": [XSS],
        },
        incidents={"2-1-1.json": {"error": {"kind": "oom", "message": XSS, "status": 500}}},
    )
    result = cli("report", "runs/r1", "--html", "--no-plot")
    assert result.code == 0, result.err
    html = (isolated / "runs/r1/report.html").read_text("utf-8")
    page = Page(html)
    assert page.count("script") == 0  # no element was injected...
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert page.text.count(XSS) >= 5  # ...the text is shown as text instead
    assert page.body_rows("tiers")[1][-1] == XSS
    assert page.body_rows("incident-list")[0][2] == XSS


def test_new_columns_are_shown_and_missing_ones_do_not_crash(cli, isolated: Path) -> None:
    """A rate sweep from a newer calibrate: percentiles, offered/achieved rate, renamed columns."""
    rows = [
        sweep_row(
            0,
            r * 0.98,
            offered_rate=r,
            achieved_rate=r * 0.98,
            saturated=False,
            ttft_p50_s=0.05,
            ttft_p99_s=0.08 * r,
            tpot_p50_s=0.004,
            itl_p99_s=0.01,
            e2e_p99_s=0.3 * r,
            per_device=[{"device": "0", "used_mib": 1}],
        )
        for r in (1, 2, 4)
    ]
    for number, row in enumerate(rows):
        row["concurrency"] = 2 + number  # in flight at most; the rows are keyed by offered rate
        del row["per_item_p50_s"]  # renamed in newer runs
    rows[-1]["saturated"] = True
    write_run(
        isolated,
        "rate",
        "sweep",
        rows,
        summary={
            "stopped_by": "saturated",
            "saturated": "saturated at 4 req/s",
            "knee": {"offered_rate": 2},
        },
    )
    result = cli("report", "runs/rate", "--html", "--no-plot")
    assert result.code == 0, result.err
    page = Page((isolated / "runs/rate/report.html").read_text("utf-8"))
    header = page.rows["tiers"][0]
    for column in (
        "ttft_p99_s",
        "tpot_p50_s",
        "itl_p99_s",
        "e2e_p99_s",
        "offered_rate",
        "achieved_rate",
        "saturated",
    ):
        assert column in header
    body = page.body_rows("tiers")
    assert len(body) == 3 and body[0][header.index("p50 s")] == "—"
    assert body[2][header.index("ttft_p99_s")] == "0.32"
    assert "saturated at 4 req/s" in page.id_text["notes"]
    assert "offered rate 2" in page.id_text["verdict-details"]


def test_the_svg_plots_need_no_matplotlib(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    write_run(
        isolated,
        "r1",
        "ladder",
        [ladder_row(1, 4.0), ladder_row(2, 8.0), ladder_row(4, 15.0)],
        records=[
            {
                "batch_size": 2,
                "round": 1,
                "ts": "2026-01-01T00:00:01.000Z",
                "elapsed_s": 0.5,
                "ok": True,
            }
        ],
    )
    result = cli("report", "runs/r1", "--html", "--timeline", "2")
    assert result.code == 0, result.err
    assert "matplotlib is not installed" in result.err and not list(
        (isolated / "runs/r1").glob("*.png")
    )
    page = Page((isolated / "runs/r1/report.html").read_text("utf-8"))
    titles = [a.get("aria-label") for t, a in page.tags if t == "svg"]
    assert titles[:4] == [
        "latency vs throughput",
        "throughput",
        "peak VRAM per tier",
        "memory pressure per tier",
    ]
    throughput = [a for t, a in page.tags if t == "g" and a.get("data-label") == "items_per_s"]
    assert throughput and page.count("circle") >= 3 + 3  # a marker per tier per plotted line


def test_html_path_is_chosen_and_an_unwritable_one_is_exit_2(cli, isolated: Path) -> None:
    write_run(isolated, "r1", "ladder", [ladder_row(1, 4.0)])
    mine = cli("report", "r1", "--html", "mine.html", "--no-plot")  # a run id works as RUN
    assert mine.code == 0 and (isolated / "mine.html").exists()
    (isolated / "blocker").write_text("a file, not a folder", "utf-8")
    bad = cli("report", "r1", "--html", "blocker/report.html", "--no-plot")
    assert bad.code == 2 and "cannot write blocker/report.html" in bad.err
    assert "Traceback" not in bad.err
