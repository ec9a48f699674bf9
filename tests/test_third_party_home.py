"""A missing or read-only HOME: calibrate creates nothing outside the run folder and the cache it
names (``~/.cache/calibrate``, else a temporary folder removed at exit), and no third-party
noise (matplotlib's "not a writable directory", its font-cache line) reaches the user."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import write_config
from tests.mockserver import REPO, start_mock

LADDER = "[ladder]\nbatch_sizes = [1, 2]\nrounds = 1\nmin_round_s = 0\n"


@pytest.fixture
def ladder_run(cli, isolated: Path) -> str:
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, LADDER)
        assert cli("single").code == 0 and cli("repro", "--runs", "1").code == 0
        ladder = cli("ladder", "--json")
        assert ladder.code == 0, ladder.err
    return f"runs/{ladder.json['run_id']}"


@pytest.mark.parametrize("home", ["missing", "read-only", "ordinary"])
def test_report_creates_nothing_outside_its_cache_and_shows_no_matplotlib_noise(
    isolated: Path, ladder_run: str, home: str
) -> None:
    homes = {"missing": isolated / "nohome", "read-only": Path("/proc"), "ordinary": isolated / "h"}
    (isolated / "h").mkdir()
    (isolated / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "MPLCONFIGDIR")}
    env.update(PYTHONPATH=str(REPO), HOME=str(homes[home]), TMPDIR=str(isolated / "tmp"))
    # report --timeline draws plot.png and timeline-2.png, each with a cache matplotlib has
    # not seen (it builds its font cache again: 1.7 s of CPU a report here, the run's most);
    # where HOME holds the cache, once more with the cache it left: still quiet, still in it
    both = [ladder_run, "--timeline", "2"]
    for args in [both, [ladder_run]] if home == "ordinary" else [both]:
        done = subprocess.run(
            [sys.executable, "-m", "calibrate", "report", *args],
            cwd=isolated,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "atplotlib" not in done.stderr and "warning" not in done.stderr.lower()
        assert "Traceback" not in done.stderr
    assert (isolated / ladder_run / "plot.png").stat().st_size > 0
    assert (isolated / ladder_run / "timeline-2.png").stat().st_size > 0
    assert not (isolated / "nohome").exists(), "a missing HOME is never created"
    assert list((isolated / "tmp").iterdir()) == [], "a temporary cache is removed at exit"
    made = sorted(str(p.relative_to(isolated / "h")) for p in (isolated / "h").rglob("*"))
    if home == "ordinary":
        assert made[:3] == [".cache", ".cache/calibrate", ".cache/calibrate/matplotlib"]
        assert all(m.startswith(".cache/calibrate") for m in made[1:])
    else:
        assert made == []
