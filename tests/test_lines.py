"""Every line calibrate prints fits 100 columns: prose wraps (``calibrate.cli.lines``), help
text is written to fit, and ``make demo`` checks its own output (scripts/line_width.py)."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest
from rich.cells import cell_len

from calibrate.cli import COMMAND_MODULES
from calibrate.cli.lines import fit, unfit
from tests.helpers import REPO

WIDTH = 100
SERVER_ACTIONS = ("start", "stop", "status", "logs")


def _too_wide(text: str) -> list[str]:
    return [line for line in text.splitlines() if cell_len(line) > WIDTH]


@pytest.mark.parametrize(
    "argv",
    [[], *([c] for c in COMMAND_MODULES), *(["server", a] for a in SERVER_ACTIONS)],
    ids=lambda argv: " ".join(argv) or "calibrate",
)
def test_every_help_fits_100_columns(cli, argv: list[str]) -> None:
    result = cli(*argv, "--help")
    assert result.code == 0, result.err
    assert not _too_wide(result.out), "\n".join(_too_wide(result.out))


def test_a_long_message_wraps_at_100_columns_and_reads_as_one_line_again(cli, isolated) -> None:
    model = "an-unusually-long-model-name-" + "x" * 40
    (isolated / "calibrate.toml").write_text(
        f'[target]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "{model}"\n', "utf-8"
    )
    result = cli("status")
    assert result.code == 0, result.err
    assert not _too_wide(result.printed), result.printed
    assert len(result.printed.splitlines()) > len(result.err.splitlines())
    first = result.err.splitlines()[0]  # the message, joined again, says what it said
    assert first.endswith(f": {model} at http://127.0.0.1:9/v1; baseline: none yet"), first


SENTENCE = (
    "setting: batch 4, concurrency 4 — batch 4: 16.2 items/s, the fastest kept tier; "
    "runs/20261205T121335Z-ladder-695dd2/tiers.csv (oom×2) next: calibrate sweep --beyond-ladder"
)
WORDS = SENTENCE.split(" ")
ANSWER = "时固定数量长度存储常用已知数据简单一种存放元素相同大小长度确定数据值相同内存。"


def test_fit_keeps_every_line_within_the_width_and_unfit_gives_the_text_back() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        width = rng.choice((40, 80, 100, 120))
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 50))]
        text = " " * rng.choice((0, 2, 4)) + " ".join(words)
        if rng.random() < 0.3:
            text += " answer: " + ANSWER * rng.randint(1, 6)
        fitted = fit(text, width)
        wide = [ln for ln in fitted.splitlines() if cell_len(ln) > width]
        assert all(len(ln.split()) == 1 for ln in wide), fitted  # a path longer than a line
        assert unfit(fitted, width) == text


def test_fit_leaves_short_lines_and_the_lines_between_them_alone() -> None:
    text = "calibrated setting: batch 4\n  batch size from ladder\nnext:   calibrate pin"
    assert fit(text, WIDTH) == text
    assert unfit(text, WIDTH) == text


def test_make_demo_checks_its_own_lines() -> None:
    """The demo takes minutes, too long for the suite: `make demo` pipes its output through
    scripts/line_width.py, which fails it on a line over 100 columns."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert re.search(r"scripts/demo\.sh 2>&1 \| \S*python\S* scripts/line_width\.py 100", recipe)
    assert "pipefail" in recipe


def test_the_line_width_check_passes_what_fits_and_fails_what_does_not() -> None:
    def check(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(REPO / "scripts" / "line_width.py"), "100"],
            input=text,
            capture_output=True,
            text=True,
            check=False,
        )

    fits = "\x1b[1m== calibrate run\x1b[0m\n" + "x" * 100 + "\n" + "时" * 50 + "\n"
    passed = check(fits)
    assert passed.returncode == 0 and passed.stdout == fits, passed.stderr
    failed = check(fits + "y" * 101 + "\n" + "时" * 51 + "\n")
    assert failed.returncode == 1
    assert "2 lines wider than 100 columns" in failed.stderr, failed.stderr


def test_a_figure_and_its_unit_stay_on_one_line() -> None:
    """export's line wrapped as "(200 journal lines, 0.0" and a next line "s)": the figure
    without its unit, the unit alone. A figure and its unit move to the next line together."""
    line = (
        "final: final.jsonl — 200 ids in input order: 200 ok, 0 failed, 0 never ran (200 x, 0.0 s)"
    )
    for width in range(len(line) - 8, len(line)):
        fitted = fit(line, width)
        assert all(not ln.strip().startswith("s)") for ln in fitted.splitlines()), fitted
        assert unfit(fitted, width) == line
    said = fit("the sweep ran " + "well " * 14 + "at 22.5 items/s and 75 % of its cap", 80)
    assert "22.5 items/s" in said and "75 %" in said.replace("\n  ", " "), said
    assert not any(ln.endswith(("22.5", " 75")) for ln in said.splitlines()), said
