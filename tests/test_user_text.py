"""What a user reads says the thing itself and says it once: no "SPEC §" (there is no SPEC in
the repository), no paragraph printed twice on a page, the engines table agreeing with the engines
calibrate knows, and the canary described as the ladder does it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from calibrate.cli import COMMAND_MODULES
from calibrate.engines import ENGINES
from tests.helpers import REPO

PAGES = sorted([REPO / "README.md", REPO / "README_zh-CN.md", *(REPO / "docs").rglob("*.md")])
HELP = [[c] for c in COMMAND_MODULES] + [["server", a] for a in ("start", "stop", "status", "logs")]


def _prose(text: str) -> list[str]:
    """A page's lines outside code blocks and tables."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced and not line.lstrip().startswith("|"):
            lines.append(line)
    return lines


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_cites_a_spec_the_repository_does_not_have(page: Path) -> None:
    said = [ln for ln in page.read_text(encoding="utf-8").splitlines() if "SPEC" in ln]
    assert not said, "\n".join(said)


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_no_help_cites_a_spec(cli, argv: list[str]) -> None:
    result = cli(*argv, "--help")
    assert result.code == 0 and "SPEC" not in result.out, result.out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_page_says_the_same_sentence_twice(page: Path) -> None:
    """docs/stages.md printed its paragraph on pin, verify and batch's weights gate twice."""
    seen: dict[str, int] = {}
    for line in _prose(page.read_text(encoding="utf-8")):
        if len(line.strip()) >= 60:
            seen[line.strip()] = seen.get(line.strip(), 0) + 1
    twice = [line for line, n in seen.items() if n > 1]
    assert not twice, "\n".join(twice)


@pytest.mark.parametrize("page", ["docs/engines.md", "docs/engines.zh-CN.md"])
def test_the_engines_table_names_each_engines_queue_gauge_and_metrics_flag(page: str) -> None:
    """docs/engines.md showed no LMDeploy queue gauge while calibrate reads
    lmdeploy:num_requests_waiting; its metrics-flag column is what the builder adds."""
    rows = {
        cells[1].strip(): cells
        for line in (REPO / page).read_text(encoding="utf-8").splitlines()
        if line.startswith("|") and (cells := line.split("|"))
    }
    for engine in ENGINES:
        row = next((cells for key, cells in rows.items() if f"`{engine.kind}`" in key), None)
        assert row is not None, f"{page}: no row for {engine.kind}"
        flag_cell, queue_cell = row[3], row[5]
        for name in engine.metrics.queue[:1]:
            assert f"`{name}`" in queue_cell, f"{page} {engine.kind}: queue gauge {name}"
        if not engine.metrics.queue:
            assert queue_cell.strip() == "—", f"{page} {engine.kind}: {queue_cell}"
        for flag in engine.trailing:
            assert f"`{flag}`" in flag_cell, f"{page} {engine.kind}: flag {flag}"
        if not engine.trailing and engine.program:
            assert flag_cell.strip().startswith("—"), f"{page} {engine.kind}: {flag_cell}"


def test_the_canary_is_described_as_the_ladder_sends_it(cli) -> None:
    """Once per round, alone after the round's measured waves — not "once per wave"."""
    ladder = " ".join(cli("ladder", "--help").out.split())
    workload = " ".join((REPO / "docs/workload.md").read_text(encoding="utf-8").split())
    assert "once per round, after the measured waves, as a canary" in ladder
    assert "once per round, alone after the round's measured waves, as a **canary**" in workload
    assert not re.search(r"once per wave", workload)
