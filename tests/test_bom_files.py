"""A file a user wrote, saved with a UTF-8 byte-order mark (Windows Notepad does), is read like
the same file without one: calibrate.toml (found, --config or CALIBRATE_CONFIG), a tasks file
(batch --input, [workload] tasks), and the JSONL files repro compares offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import write_config

BOM = b"\xef\xbb\xbf"


def _with_bom(path: Path) -> None:
    path.write_bytes(BOM + path.read_bytes())


@pytest.mark.parametrize("how", ["found", "--config", "CALIBRATE_CONFIG"])
def test_a_config_with_a_byte_order_mark_is_read(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    name = "calibrate.toml" if how == "found" else "mine.toml"
    _with_bom(write_config(isolated / name, "http://127.0.0.1:9/v1", model="bom-model"))
    args = ["status", "--show-config", "--json"]
    if how == "--config":
        args += ["--config", name]
    elif how == "CALIBRATE_CONFIG":
        monkeypatch.setenv("CALIBRATE_CONFIG", name)
    result = cli(*args)
    assert result.code == 0, result.err
    assert result.json["config"]["target"]["model"] == "bom-model"


def test_a_tasks_file_with_a_byte_order_mark_is_read_by_batch_and_the_workload(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = isolated / "tasks.jsonl"
    tasks.write_bytes(BOM + b'{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n')
    result = cli("batch", "--input", "tasks.jsonl", "--out", "out.jsonl", "--json")
    assert result.code == 0, result.err
    done = [json.loads(x) for x in (isolated / "out.jsonl").read_text().splitlines()]
    assert sorted(x["id"] for x in done) == [1, 2]
    from calibrate.io.tasks import load_pool

    assert sorted(load_pool(tasks, pick="longest").messages) == ["a", "b"]


def test_repro_files_with_a_byte_order_mark_are_compared(cli, isolated: Path) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        (isolated / name).write_bytes(BOM + b'{"text": "x", "ts": 1}\n')
    result = cli("repro", "a.jsonl", "b.jsonl", "--ignore", "ts")
    assert result.code == 0, result.err
