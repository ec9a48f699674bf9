"""Files the tool reads back: a malformed ledger line is skipped with a warning naming it (never a
crash of status, gates, pin or rollback); a bad tiers.csv is exit 2 for report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes import append_ledger
from tests.mockserver import start_mock
from tests.tier_helpers import open_gate

BAD_LINES = [
    '{"ts": "2026", "stage": "ladder", "run_id": "r", "target": "',  # torn by a crash
    '{"stage": 3, "passed": true}',
    '{"stage": "ladder", "target": "T", "passed": "yes"}',
    '{"stage": "pin", "target": "T", "passed": true, "summary": [1, 2]}',
    "[1, 2, 3]",
    "not json at all",
]


def test_malformed_ledger_lines_are_skipped_with_a_warning_naming_them(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        target = open_gate(isolated, mock.base_url)  # line 1: a passing repro
        ledger = isolated / "runs/ledger.jsonl"
        with ledger.open("ab") as handle:
            for line in BAD_LINES:
                handle.write(line.replace('"T"', json.dumps(target)).encode() + b"\n")
            handle.write(b'{"stage": "ladder", "target": "\xff\xfe"}\n')  # not UTF-8
        # a good line whose text holds U+2028 and U+0085: one record, not three lines
        append_ledger(
            isolated,
            "ladder",
            target,
            {"last_passing": {"batch_size": 2}, "note": "a\u2028b\u0085c"},
        )
        status = cli("status", "--json")
        assert status.code == 0, status.err
        for number in range(2, 2 + len(BAD_LINES) + 1):
            assert f"skipping line {number} of runs/ledger.jsonl" in status.err
        assert "skipping line 9" not in status.err  # the U+2028 record is read whole
        # (parsed whole: the note's U+2028 must not split the JSON line)
        assert json.loads(status.out)["last_passing"] == {"batch_size": 2}
        assert "Traceback" not in status.err
        # the gates still read the good lines: sweep and pin open, rollback finds its tier
        assert cli("pin", "--kind", "vllm").code != 3
        rollback = cli("rollback", "--wait", "0")
        assert rollback.code in (0, 1, 4) and "Traceback" not in rollback.err
        assert "rollback to batch 2" in rollback.err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"batch_size,concurrency\n1,1\n", "no column rounds, items, errors, verdict"),
        (b"", "tiers.csv"),
        (b"\x00\xff\xfe binary", "tiers.csv"),
        (b"batch_size,concurrency,rounds,items,errors,verdict\nabc,1,2,3,0,pass\n", "batch_size"),
        (
            b"batch_size,concurrency,rounds,items,errors,verdict,per_item_p50_s\n"
            b"1,1,2,3,0,pass,fast\n",
            "tiers.csv",
        ),
    ],
)
def test_report_on_a_bad_tiers_csv_is_exit_2(
    cli, isolated: Path, content: bytes, needle: str
) -> None:
    run = isolated / "runs/20261129T164129Z-ladder-a1b2c3"
    run.mkdir(parents=True)
    (run / "tiers.csv").write_bytes(content)
    (run / "manifest.json").write_text('["not", "an", "object"]')
    result = cli("report", str(run), "--no-plot")
    assert result.code == 2, result.err
    assert needle in result.err and "Traceback" not in result.err


TORN_TAILS = {
    "cut mid-record": lambda line: line[:-12],
    "its newline lost": lambda line: line[:-1],
    "cut inside a UTF-8 character": lambda line: line[: line.index("用".encode()) + 1],
    "zeros after a full disk": lambda line: line + b"\x00" * 64,
}


@pytest.mark.parametrize("case", sorted(TORN_TAILS))
def test_a_torn_ledger_tail_never_swallows_the_next_result(cli, isolated: Path, case: str) -> None:
    """The next append ends the torn line first: the stage that says passed is what status shows."""
    from tests.helpers import write_config

    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        first = cli("single", "--json")
        assert first.code == 0, first.err
        ledger = isolated / "runs/ledger.jsonl"
        data = ledger.read_bytes()
        assert data.endswith(b"\n") and "用".encode() in data
        ledger.write_bytes(TORN_TAILS[case](data))
        for _ in range(2):  # and the one after it too
            again = cli("single", "--json")
            assert again.code == 0 and again.json["passed"] is True, again.err
            status = cli("status", "--json")
            assert status.code == 0, status.err
            assert json.loads(status.out)["stages"]["single"]["run_id"] == again.json["run_id"]
    assert ledger.read_bytes().endswith(b"\n")


def test_a_jsonl_writer_opened_on_a_torn_file_starts_a_new_line(isolated: Path) -> None:
    from calibrate.io.jsonl import JsonlWriter, read_jsonl

    for tail in (b'{"a": 1', b'{"a": 1}', b"\xe7\x94", b""):
        path = isolated / "records.jsonl"
        path.write_bytes(b'{"first": true}\n' + tail)
        with JsonlWriter(path) as writer:
            writer.write({"next": 2})
        assert list(read_jsonl(path))[-1] == {"next": 2}, tail
        assert path.read_bytes().endswith(b'{"next":2}\n')
        assert b"\n\n" not in path.read_bytes()
