"""One rule for ids (docs/batch.md): an id is a string or an integer, and one input never holds
two ids with the same text (``1`` and ``"1"``) — CSV and Parquet write an id as its text, so
such a pair would be two rows with id ``1``. Refused at the input by every reader (exit 2
naming both lines, nothing sent), so the journal and every export format name one item per id
text; a journal line whose id has the other type is not that item."""

from __future__ import annotations

import csv
import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.batch_helpers import results
from tests.helpers import write_config


def _tasks(path: Path, ids: list[object]) -> Path:
    path.write_text(
        "".join(json.dumps({"id": i, "text": f"item {i!r}"}) + "\n" for i in ids), "utf-8"
    )
    return path


COMMANDS = {
    "batch": ["batch", "--input", "tasks.jsonl", "--out", "out.jsonl"],
    "export": ["export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "final.csv"],
    "ladder --tasks": ["ladder", "--force", "--tasks", "tasks.jsonl"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        ([1, "a", "1"], "line 3: id '1' and id 1 (line 1) differ only in type"),
        (["-7", 3, -7], "line 3: id -7 and id '-7' (line 1) differ only in type"),
    ],
)
def test_ids_that_differ_only_in_type_are_refused_by_every_reader(
    cli, mock, isolated: Path, command: str, ids: list[object], needle: str
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    _tasks(isolated / "tasks.jsonl", ids)
    (isolated / "out.jsonl").write_bytes(b"")
    sent = mock.model.snapshot().requests_total
    result = cli(*COMMANDS[command])
    assert result.code == 2, result.err
    assert needle in result.err and "ambiguous" in result.err
    assert mock.model.snapshot().requests_total == sent
    assert (isolated / "out.jsonl").read_bytes() == b""
    assert not (isolated / "final.csv").exists()


def test_ids_with_distinct_texts_are_distinct_rows_in_every_format(
    cli, mock, isolated: Path
) -> None:
    """``1``, ``"01"``, ``-1``, ``"-01"`` and ``"a"``: five texts, five rows; JSONL keeps the
    types as the input gave them."""
    write_config(isolated / "calibrate.toml", mock.base_url)
    ids: list[object] = [1, "01", -1, "-01", "a"]
    _tasks(isolated / "tasks.jsonl", ids)
    result = cli("batch", "--input", "tasks.jsonl", "--out", "out.jsonl", "--final", "final.jsonl")
    assert result.code == 0, result.err
    assert [r["id"] for r in results(isolated / "final.jsonl")] == ids
    assert (
        cli("export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "final.csv").code == 0
    )
    with (isolated / "final.csv").open(encoding="utf-8", newline="") as handle:
        rows = [row["id"] for row in csv.DictReader(handle)]
    assert rows == ["1", "01", "-1", "'-01", "a"]  # a text starting with - gets a '
    assert len(set(rows)) == len(ids)
    if importlib.util.find_spec("pyarrow") is None:
        return
    assert (
        cli("export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "final.parquet").code
        == 0
    )
    parquet: Any = importlib.import_module("pyarrow.parquet")
    assert parquet.read_table(isolated / "final.parquet").column("id").to_pylist() == [
        "1",
        "01",
        "-1",
        "-01",
        "a",
    ]


def test_a_journal_line_whose_id_has_the_other_type_is_not_that_item(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    _tasks(isolated / "tasks.jsonl", [1, 2])
    journal = isolated / "out.jsonl"
    journal.write_text('{"id":"1","ok":true,"output":"x","attempts":1}\n', "utf-8")
    result = cli("batch", "--input", "tasks.jsonl", "--out", "out.jsonl")
    assert result.code == 2, result.err
    assert "id '1', where the input has 1: an id's type is part of it" in result.err
    exported = cli(
        "export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "final.jsonl", "--json"
    )
    assert exported.json["ok"] == 0 and exported.json["foreign"] == 1
