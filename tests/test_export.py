"""One result per input id, in input order: export, batch --final, shards merged."""

from __future__ import annotations

import csv
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from calibrate.errors import Unwritten
from calibrate.io.jobs.shard import Shard, shard_of
from calibrate.io.jsonl import dumps_line
from calibrate.stages.export import export_final
from calibrate.stages.export import formats as export_formats
from tests.batch_helpers import assert_valid_jsonl, write_tasks
from tests.helpers import write_config
from tests.mockserver import REPO, start_mock


def _ok(item_id: object, output: str) -> dict:
    return {
        "id": item_id,
        "ok": True,
        "output": output,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "seconds": 0.1,
        "attempts": 1,
    }


def _failed(item_id: object, kind: str) -> dict:
    return {
        "id": item_id,
        "ok": False,
        "error": {"kind": kind, "message": f"{kind}!", "status": None},
        "attempts": 4,
    }


def _journal(path: Path, records: list[dict], tail: bytes = b"") -> Path:
    path.write_bytes(b"".join((dumps_line(r) + "\n").encode() for r in records) + tail)
    return path


def test_final_is_input_order_with_the_last_ok_else_the_last_failure(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 6)
    journal = _journal(
        isolated / "out.jsonl",
        [
            _failed("t3", "http_5xx"),
            _ok("t1", "one"),
            _ok("t3", "three, second try"),
            _failed("t3", "format"),  # a later failure does not undo the success
            _failed("t0", "timeout"),
            _failed("t0", "reset"),
            _ok("t5", "five"),
            _ok("zz", "foreign"),
        ],
        tail=b'{"id":"t2","ok":true,"output":"tw',  # cut by a kill mid-write: no record
    )
    result = cli(
        "export", "--input", str(tasks), "--out", str(journal), "--to", "final.jsonl", "--json"
    )
    assert result.code == 1, result.err  # not every id is ok
    final = assert_valid_jsonl(isolated / "final.jsonl")
    assert [r["id"] for r in final] == [f"t{i}" for i in range(6)]
    by_id = {r["id"]: r for r in final}
    assert by_id["t3"]["output"] == "three, second try" and by_id["t1"]["ok"]
    assert by_id["t0"]["error"]["kind"] == "reset"  # the last failure
    assert by_id["t2"]["error"]["kind"] == "not_run" and by_id["t4"]["error"]["kind"] == "not_run"
    failed = assert_valid_jsonl(isolated / "final.failed.jsonl")
    assert [(f["id"], f["status"]) for f in failed] == [
        ("t0", "failed"),
        ("t2", "not_run"),
        ("t4", "not_run"),
    ]
    assert result.json["ok"] == 3 and result.json["foreign"] == 1
    assert "1 journal line(s) are not ids of the input" in result.err


def test_all_ok_exits_0_and_csv_has_one_row_per_id(cli, isolated: Path) -> None:
    tasks = isolated / "tasks.jsonl"
    tasks.write_text('{"id": 2, "text": "b"}\n{"id": "1", "text": "a"}\n', encoding="utf-8")
    journal = _journal(isolated / "out.jsonl", [_ok("1", '一,\n"二"'), _ok(2, "two")])
    result = cli("export", "--input", str(tasks), "--out", str(journal), "--to", "final.csv")
    assert result.code == 0, result.err
    with (isolated / "final.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["id"], r["ok"], r["output"]) for r in rows] == [
        ("2", "True", "two"),
        ("1", "True", '一,\n"二"'),
    ]
    assert assert_valid_jsonl(isolated / "final.failed.jsonl") == []


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is not None, reason="pyarrow installed")
def test_parquet_without_pyarrow_exits_2_before_anything_runs(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    result = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "--final", "f.parquet")
    assert (
        result.code == 2 and "needs pyarrow" in result.err and "pip install pyarrow" in result.err
    )
    assert not (isolated / "out.jsonl").exists() and not (isolated / "runs").exists()


def test_a_final_path_that_cannot_be_written_exits_2_before_anything_runs(
    cli, isolated: Path
) -> None:
    """Found out only after the batch, it cost the run its verdict (an OSError before the
    ledger line); now it is a usage error before a request is sent."""
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    (isolated / "a-file").write_text("x")
    result = cli(
        "batch", "--input", str(tasks), "--out", "out.jsonl", "--final", "a-file/final.jsonl"
    )
    assert result.code == 2 and "cannot write --final a-file/final.jsonl" in result.err
    assert not (isolated / "out.jsonl").exists() and not (isolated / "runs").exists()


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="pyarrow not installed")
def test_parquet_has_one_row_per_id(isolated: Path) -> None:  # pragma: no cover - optional dep
    import pyarrow.parquet as pq

    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    journal = _journal(isolated / "out.jsonl", [_ok("t2", "x"), _ok("t0", "y")])
    export_final(tasks, [journal], isolated / "f.parquet")
    table = pq.read_table(isolated / "f.parquet").to_pylist()
    assert [(r["id"], r["ok"]) for r in table] == [("t0", True), ("t1", False), ("t2", True)]


def test_a_failed_export_leaves_the_previous_final_untouched(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 50)
    journal = _journal(isolated / "out.jsonl", [_ok(f"t{i}", "x") for i in range(50)])
    final = isolated / "final.jsonl"
    final.write_text("the previous final\n")
    calls = Counter[str]()
    real = export_formats.JsonlFinal.write

    def failing_write(self, raw: bytes, record: object) -> None:
        calls["n"] += 1
        if calls["n"] == 20:
            raise OSError(28, "No space left on device")
        real(self, raw, record)

    monkeypatch.setattr(export_formats.JsonlFinal, "write", failing_write)
    with pytest.raises(Unwritten) as failed:  # exit 1, naming the file
        export_final(tasks, [journal], final)
    assert failed.value.exit_code == 1 and "final.jsonl" in failed.value.message
    assert final.read_text() == "the previous final\n"
    assert sorted(p.name for p in isolated.iterdir()) == ["final.jsonl", "out.jsonl", "tasks.jsonl"]


def test_batch_final_writes_the_final_file_after_retries(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0002, fail_rate=0.3, seed=5) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 40)
        out = isolated / "out.jsonl"
        first = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "--retries",
            "0",
            "--final",
            "final.jsonl",
            "--json",
        )
        assert first.code == 1 and first.json["final"]["failed"] > 0
        assert len(assert_valid_jsonl(isolated / "final.failed.jsonl")) == first.json["failed"]
        second = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "--retries",
            "10",
            "--backoff-s",
            "0.01",
            "--final",
            "final.jsonl",
            "--json",
        )
    assert second.code == 0, second.err
    journal = assert_valid_jsonl(out)
    assert len(journal) > 40, "the journal keeps every line, retried ids included"
    final = assert_valid_jsonl(isolated / "final.jsonl")
    assert [r["id"] for r in final] == [f"t{i}" for i in range(40)] and all(r["ok"] for r in final)
    assert second.json["final"]["ok"] == 40 and "final: final.jsonl" in second.err


def test_shards_cover_every_id_exactly_once_and_export_merges_them(cli, isolated: Path) -> None:
    ids = [f"t{i}" for i in range(100)]
    assert Counter(shard_of(i, 3) for i in ids).keys() == {0, 1, 2}
    tasks = write_tasks(isolated / "tasks.jsonl", 100)
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        counts = []
        for index in range(3):
            result = cli(
                "batch",
                "--input",
                str(tasks),
                "--out",
                f"out-{index}.jsonl",
                "--shard",
                f"{index}/3",
                "-c",
                "8",
                "--json",
            )
            assert result.code == 0, result.err
            counts.append(result.json["total"])
            assert f"batch (shard {index}/3)" in result.err
    journals = [assert_valid_jsonl(isolated / f"out-{i}.jsonl") for i in range(3)]
    seen = Counter(r["id"] for journal in journals for r in journal)
    assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}
    assert sum(counts) == 100 and all(counts)
    merged = cli(
        "export",
        "--input",
        str(tasks),
        "--out",
        "out-0.jsonl,out-1.jsonl",
        "--out",
        "out-2.jsonl",
        "--to",
        "final.jsonl",
    )
    assert merged.code == 0, merged.err
    assert [r["id"] for r in assert_valid_jsonl(isolated / "final.jsonl")] == ids


def test_a_shard_given_another_shard_s_out_is_told_so(cli, isolated: Path) -> None:
    """A Slurm index mixed up (shard 1 on out-0.jsonl) is not "a different input file?": the
    lines are the input's, of another shard; nothing is sent, and --allow-foreign says it too."""
    tasks = write_tasks(isolated / "tasks.jsonl", 30)
    batch = ["batch", "--input", str(tasks), "--out", "out-0.jsonl", "-c", "4"]
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        assert cli(*batch, "--shard", "0/3").code == 0
        kept = (isolated / "out-0.jsonl").read_bytes()
        sent = server.model.snapshot().requests_total
        wrong = cli(*batch, "--shard", "1/3")
        assert server.model.snapshot().requests_total == sent
        assert wrong.code == 2 and (isolated / "out-0.jsonl").read_bytes() == kept
        allowed = cli(*batch, "--shard", "1/3", "--allow-foreign")
    lines = kept.count(b"\n")
    for said in (wrong.err, allowed.err):
        assert f"{lines} line(s) of other shards' items of {tasks}" in said, said
        assert "is shard 0/3's, this run is shard 1/3" in said and "different input" not in said
    assert "out-1.jsonl" in wrong.err and "--allow-foreign" in wrong.err
    assert allowed.code == 0 and "(kept, --allow-foreign)" in allowed.err


def test_shard_hash_is_stable_and_not_pythons_hash() -> None:
    # fixed values (CRC-32 of the id's JSON): any process, any machine, any PYTHONHASHSEED
    assert [shard_of(f"t{i}", 4) for i in range(8)] == [2, 3, 0, 1, 2, 3, 0, 1]
    assert (shard_of(1, 7), shard_of("1", 7)) == (2, 5)  # 1 and "1" are different ids
    assert Shard.parse("2/8") == Shard(2, 8) and Shard(0, 1).holds("anything")


@pytest.mark.parametrize("text", ["3/3", "1", "a/b", "-1/2", "0/0"])
def test_a_bad_shard_exits_2(cli, isolated: Path, text: str) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 2)
    result = cli("batch", "--input", str(tasks), "--out", "o.jsonl", "--shard", text)
    assert result.code == 2 and "--shard" in result.err


# --- CSV cells a spreadsheet would run ---------------------------------------------------

FORMULAS = ["=1+1", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)", "\t=1", "\r=1", "=HYPERLINK(x)"]
HARMLESS = ["a=b", "1-2", "plain text", "", "'already quoted", "中文=公式"]


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def test_csv_cells_that_a_spreadsheet_would_run_get_a_quote_and_raw_csv_keeps_them(
    cli, isolated: Path
) -> None:
    texts = [*FORMULAS, *HARMLESS]
    tasks = isolated / "tasks.jsonl"
    ids: list[object] = [f"={i}" if i % 2 else -i - 1 for i in range(len(texts))]
    tasks.write_text(
        "".join(dumps_line({"id": i, "text": "x"}) + "\n" for i in ids), encoding="utf-8"
    )
    records = [_ok(i, text) for i, text in zip(ids, texts, strict=True)]
    records[0] = {**_failed(ids[0], "format"), "error": {"kind": "format", "message": "@evil"}}
    journal = _journal(isolated / "out.jsonl", records)
    result = cli("export", "--input", str(tasks), "--out", str(journal), "--to", "safe.csv")
    assert result.code == 1, result.err
    rows = _csv_rows(isolated / "safe.csv")
    for row, text, item_id in zip(rows[1:], texts[1:], ids[1:], strict=True):
        expected = "'" + text if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text
        assert row["output"] == expected, (text, row)
        assert row["id"] == (f"'{item_id}" if isinstance(item_id, str) else str(item_id))
    assert rows[0]["error_message"] == "'@evil" and rows[0]["output"] == ""
    # the journal-shaped outputs stay exact: only CSV cells change
    assert [r.get("output") for r in assert_valid_jsonl(journal)][1:] == texts[1:]
    raw = cli(
        "export", "--input", str(tasks), "--out", str(journal), "--to", "raw.csv", "--raw-csv"
    )
    assert raw.code == 1, raw.err
    raw_rows = _csv_rows(isolated / "raw.csv")
    assert [r["output"] for r in raw_rows[1:]] == texts[1:]
    assert raw_rows[0]["error_message"] == "@evil"
    final = cli("export", "--input", str(tasks), "--out", str(journal), "--to", "f.jsonl")
    assert [r.get("output") for r in assert_valid_jsonl(isolated / "f.jsonl")][1:] == texts[1:]
    assert final.code == 1


# --- ids that are neither strings nor integers --------------------------------------------

BAD_IDS = {"a list": [1], "an object": {"a": 1}, "a float": 1.0, "true": True, "null": None}


@pytest.mark.parametrize("case", sorted(BAD_IDS))
def test_a_journal_id_that_is_not_a_string_or_integer_is_exit_2_naming_the_line(
    cli, isolated: Path, case: str
) -> None:
    tasks = isolated / "tasks.jsonl"
    tasks.write_text('{"id": 1, "text": "a"}\n{"id": "b", "text": "b"}\n', encoding="utf-8")
    journal = _journal(
        isolated / "out.jsonl", [_ok("b", "bee"), _ok(1, "one"), _ok(BAD_IDS[case], "bad")]
    )
    result = cli("export", "--input", str(tasks), "--out", str(journal), "--to", "final.jsonl")
    assert result.code == 2, result.err
    assert f"{journal} line 3" in result.err and "string or an integer" in result.err
    assert "Traceback" not in result.err
    assert not (isolated / "final.jsonl").exists()


def test_an_integer_id_of_hundreds_of_digits_is_foreign_not_a_crash(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 1)
    journal = isolated / "out.jsonl"
    journal.write_text(
        f'{{"id":{"9" * 5000},"ok":true,"output":"x","attempts":1}}\n'
        + dumps_line(_ok("t0", "zero"))
        + "\n",
        encoding="utf-8",
    )
    result = cli("export", "--input", str(tasks), "--out", str(journal), "--to", "f.jsonl")
    assert result.code == 0, result.err
    assert "1 journal line(s) are not ids of the input" in result.err


# --- interrupted and killed exports leave no temp files --------------------------------------


def _big_export(root: Path, n: int = 20_000) -> list[str]:
    with (root / "tasks.jsonl").open("w") as tasks, (root / "out.jsonl").open("w") as out:
        for i in range(n):
            tasks.write(dumps_line({"id": f"t{i}", "text": "x" * 40}) + "\n")
            out.write(dumps_line(_ok(f"t{i}", "y" * 300)) + "\n")
    return ["export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "final.csv"]


def _start(root: Path, args: list[str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, "-m", "calibrate", *args],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _temps(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob(".final.*"))


def _when_writing(root: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not _temps(root) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    assert _temps(root), "the export never started writing"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_export_removes_its_temp_files(isolated: Path, sig: signal.Signals) -> None:
    proc = _start(isolated, _big_export(isolated))
    _when_writing(isolated, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:
        pytest.skip("the export finished before the signal arrived")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _temps(isolated) == [] and not (isolated / "final.csv").exists()


def test_temp_files_of_a_killed_export_are_removed_by_the_next_one(isolated: Path) -> None:
    args = _big_export(isolated)
    proc = _start(isolated, args)
    _when_writing(isolated, proc)
    proc.kill()
    proc.communicate(timeout=30)
    left = _temps(isolated)
    assert left and all(f".{proc.pid}." in name for name in left)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a temp file of a live export (another process) is never touched
        live = isolated / f".final.csv.{sleeper.pid}.live"
        live.write_bytes(b"partial")
        other = isolated / ".final.csv.notours"
        other.write_bytes(b"x")
        again = _start(isolated, args)
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        assert _temps(isolated) == sorted([live.name, other.name])
    finally:
        sleeper.kill()
        sleeper.wait()
    assert len(_csv_rows(isolated / "final.csv")) == 20_000


def test_a_piped_input_and_a_piped_journal_are_read_whole(cli, isolated: Path) -> None:
    """``export --input <(…) --out <(zcat …)``: each pipe is copied once and read there (the
    input's second pass read an empty pipe: "5 ids: 0 ok"; a piped journal could not be
    seeked into)."""
    tasks = write_tasks(isolated / "tasks.jsonl", 5)
    journal = _journal(isolated / "out.jsonl", [_ok(f"t{i}", f"o{i}") for i in range(5)])
    pipes = []
    for name, source in (("in.fifo", tasks), ("out.fifo", journal)):
        fifo = isolated / name
        os.mkfifo(fifo)
        feeder = threading.Thread(target=fifo.write_bytes, args=(source.read_bytes(),))
        feeder.start()
        pipes.append((fifo, feeder))
    (in_fifo, in_feeder), (out_fifo, out_feeder) = pipes
    result = cli(
        "export", "--input", str(in_fifo), "--out", str(out_fifo), "--to", "final.jsonl", "--json"
    )
    in_feeder.join(5)
    out_feeder.join(5)
    assert result.code == 0, result.err
    assert result.json["ok"] == 5 and result.json["total"] == 5
    assert [r["id"] for r in assert_valid_jsonl(isolated / "final.jsonl")] == [
        f"t{i}" for i in range(5)
    ]


def test_one_journal_given_twice_is_exit_2_not_counted_twice(cli, isolated: Path) -> None:
    """`--out out.jsonl,./out.jsonl` wrote the final file saying "(40 journal lines)" of a
    20-line journal: its lines were read and counted twice. Now exit 2, nothing written."""
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    _journal(isolated / "out.jsonl", [_ok(f"t{i}", f"o{i}") for i in range(3)])
    result = cli(
        "export", "--input", str(tasks), "--out", "out.jsonl,./out.jsonl", "--to", "f.jsonl"
    )
    assert result.code == 2, result.err
    assert "is the same journal as --out out.jsonl" in result.err
    assert not list(isolated.glob("f*.jsonl"))
    once = cli("export", "--input", str(tasks), "--out", "out.jsonl", "--to", "f.jsonl", "--json")
    assert once.code == 0 and once.json["journal_lines"] == 3


def test_a_journal_with_no_result_line_is_exit_2_and_stray_lines_are_said(
    cli, isolated: Path
) -> None:
    """The tasks file given as --out (or another tool's output) wrote a final file of every
    item "never ran", exit 1, with "(0 journal lines)" the only hint; lines of a journal that
    are no result were dropped without a word. The first is exit 2 with nothing written, the
    second a warning counting them (``not_results`` in --json)."""
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    wrong = cli("export", "--input", str(tasks), "--out", str(tasks), "--to", "f.jsonl")
    assert wrong.code == 2, wrong.err
    assert "holds no result of calibrate batch: none of its 3 line(s) is one" in wrong.err
    assert "Traceback" not in wrong.err and not list(isolated.glob("f*.jsonl"))
    results = [_ok(f"t{i}", f"o{i}") for i in range(3)]
    _journal(isolated / "out.jsonl", results, tail=b'{"note": "appended by hand"}\n\n')
    mixed = cli("export", "--input", str(tasks), "--out", "out.jsonl", "--to", "f.jsonl", "--json")
    assert mixed.code == 0, mixed.err
    assert mixed.json["not_results"] == 1 and mixed.json["ok"] == 3
    assert "1 line(s) of the journal(s) are no result of calibrate batch: skipped" in mixed.err


def test_a_shard_that_holds_no_item_says_so_not_all_0_items_ok(cli, isolated: Path) -> None:
    """`--shard 0/2` of an input whose ids all hash to shard 1 printed "all 0 items ok: s0.jsonl"
    — a success line about items that were never there. It says there was nothing to run."""
    tasks = write_tasks(isolated / "tasks.jsonl", 1)
    other = 1 - shard_of("t0", 2)
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("batch", "--input", str(tasks), "--out", "s.jsonl", "--shard", f"{other}/2")
    assert result.code == 0, result.err
    said = " ".join(result.err.split())
    assert f"nothing to run: shard {other}/2 of {tasks} holds no item" in said, said
    assert "all 0 items ok" not in said


# --- a journal line edited by hand or written by another calibrate ------------------------


@pytest.mark.parametrize("error", ["boom", ["a", "b"], 7, None])
def test_a_failed_line_whose_error_is_not_an_object_is_listed_not_a_crash(
    cli, isolated: Path, error: object
) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 2)
    failure = {"id": "t1", "ok": False, "error": error, "attempts": 1}
    journal = _journal(isolated / "out.jsonl", [_ok("t0", "zero"), failure])
    for to in ("final.jsonl", "final.csv"):
        result = cli("export", "--input", str(tasks), "--out", str(journal), "--to", to)
        assert result.code == 1, result.err
        assert "Traceback" not in result.err and "1 ok, 1 failed" in result.err
        failed = assert_valid_jsonl(isolated / "final.failed.jsonl")
        assert [(f["id"], f["status"]) for f in failed] == [("t1", "failed")]
        assert failed[0]["message"] == (error if isinstance(error, str) else None)
