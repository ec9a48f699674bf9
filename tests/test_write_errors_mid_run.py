"""A write that fails mid-ladder or mid-sweep (a full disk): exit 1 naming the file, and the
tiers or levels measured before it shown, written to tiers.csv and reportable.

Before, the stage stopped at the failed write: exit 1 "a write failed (…records.jsonl…)", no
tiers.csv, nothing recorded, and ``report RUN`` answered "tiers.csv does not exist: … is not a
finished ladder or sweep run" for a run that had measured two tiers.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from calibrate.io import jsonl
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate

FULL = "No space left on device"
SWEEP = "[sweep]\nconcurrency = [1, 2, 4, 8]\nlevel_s = 0\nrepeats = 1\nmax_repeats = 1\n"


class _FullDisk:
    """An open file on a full disk: every write fails as the kernel's does, naming no file (its
    descriptor is /dev/full's: ENOSPC from the kernel itself)."""

    def __init__(self, handle: object) -> None:
        self._handle = handle
        self._full = open("/dev/full", "wb", buffering=0)  # noqa: SIM115 (closed in close)

    def fileno(self) -> int:
        return self._full.fileno()

    def write(self, data: object) -> int:
        raise OSError(errno.ENOSPC, FULL)

    def close(self) -> None:
        self._full.close()
        self._handle.close()  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._handle, name)


def _disk_full_at(patch: pytest.MonkeyPatch, field: str, value: int) -> None:
    """From records.jsonl's first record whose ``field`` is ``value`` on, its writes fail as on
    a full disk."""
    append = jsonl.JsonlWriter._append

    def maybe_full(self: jsonl.JsonlWriter, raw: bytes) -> None:
        if self.path.name == "records.jsonl" and json.loads(raw).get(field) == value:
            self._handle = _FullDisk(self._handle)  # type: ignore[assignment]
        append(self, raw)

    patch.setattr(jsonl.JsonlWriter, "_append", maybe_full)


def _table_lines(text: str, first: str) -> list[list[str]]:
    """The rows of the table a log shows, from its header (``first`` column) on: cells split."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.split()[:1] == [first])
    rows = []
    for line in lines[start + 1 :]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        rows.append(cells)
    return rows


@pytest.mark.parametrize(
    ("stage", "field", "shown"),
    [("ladder", "batch_size", ["1", "2"]), ("sweep", "concurrency", ["1", "2"])],
)
def test_a_full_disk_mid_run_keeps_and_shows_what_was_measured(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, stage: str, field: str, shown: list[str]
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(
            isolated, mock.base_url, FAST + SWEEP, stage="ladder" if stage == "sweep" else "repro"
        )
        with monkeypatch.context() as patch:
            _disk_full_at(patch, field, 4)
            result = cli(stage)
    assert result.code == 1, result.err
    assert "Traceback" not in result.err
    (run,) = [p.relative_to(isolated) for p in (isolated / "runs").glob(f"*-{stage}-*")]
    unit = "tier(s)" if stage == "ladder" else "level(s)"
    assert (
        f"{stage} stopped: a write failed ({run / 'records.jsonl'}: {FULL}); "
        f"the 2 {unit} measured before it are in {run / 'tiers.csv'} "
        f"(calibrate report {run})"
    ) in " ".join(result.err.split()), result.err
    said = _table_lines(result.err, "batch" if stage == "ladder" else "conc")
    assert [cells[0] for cells in said] == shown, result.err

    report = cli("report", str(run), "--json", "--no-plot")
    assert report.code == 0, report.err
    key = "batch_size" if stage == "ladder" else "concurrency"
    assert [str(row[key]) for row in report.json["rows"]] == shown
    status = cli("status", "--json")
    assert status.json["stages"][stage]["passed"] is False, status.out


def test_a_full_disk_in_the_first_tier_leaves_a_run_report_explains(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url)
        with monkeypatch.context() as patch:
            _disk_full_at(patch, "batch_size", 1)
            result = cli("ladder")
    assert result.code == 1 and "Traceback" not in result.err, result.err
    assert "a write failed" in result.err and FULL in result.err
    (run,) = [p.relative_to(isolated) for p in (isolated / "runs").glob("*-ladder-*")]
    assert f"what was written is kept in {run}" in " ".join(result.err.split())
    report = cli("report", str(run))
    assert report.code == 2 and "Traceback" not in report.err, report.err
    assert "this ladder ended before it wrote its table" in report.err
    assert len(report.err.strip().splitlines()) == 2, report.err  # the error and what to do


def test_a_disk_still_full_for_the_table_says_the_first_failure_and_what_was_kept(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tiers.csv cannot be written either: the write that stopped the run is the one named,
    the tiers shown as they finished stay on screen, and nothing raises past the message."""
    from calibrate.io import tier_table

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, FULL, str(path))

    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        open_gate(isolated, mock.base_url)
        with monkeypatch.context() as patch:
            _disk_full_at(patch, "batch_size", 4)
            patch.setattr(tier_table, "write_atomic", full)
            result = cli("ladder")
    assert result.code == 1 and "Traceback" not in result.err, result.err
    (run,) = [p.relative_to(isolated) for p in (isolated / "runs").glob("*-ladder-*")]
    assert (
        f"a write failed ({run / 'records.jsonl'}: {FULL}); what was written is kept in {run}"
    ) in " ".join(result.err.split()), result.err
    assert [cells[0] for cells in _table_lines(result.err, "batch")] == ["1", "2"]
    assert "tiers.csv" not in result.err
