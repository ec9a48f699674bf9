"""One result per input id, in input order: export, batch --final, shards merged."""

from __future__ import annotations

import csv
import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from calibrate.stages import export_formats
from calibrate.stages.batch_shard import Shard, shard_of
from calibrate.stages.export import export_final
from calibrate.store import dumps_line
from tests.batch_helpers import assert_valid_jsonl, write_tasks
from tests.conftest import write_config
from tests.mockserver import start_mock


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
    with pytest.raises(OSError):
        export_final(tasks, [journal], final)
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
