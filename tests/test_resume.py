"""Resume: the output scan (fast path, fallbacks, torn lines) and a real kill -9 mid-run."""

from __future__ import annotations

import json
from pathlib import Path

from calibrate.io.journal.scan import repair_tail, scan_output
from calibrate.io.jsonl import dumps_line
from tests.batch_helpers import assert_each_item_once, batch_process, wait_for_lines, write_tasks
from tests.helpers import kill_9, reaped, write_config
from tests.mockserver import start_mock


def line(item_id: object, ok: bool = True) -> str:
    obj = {"id": item_id, "ok": ok, "output": 'say "hi"\n', "usage": {"a": 1}, "attempts": 1}
    if not ok:
        obj = {"id": item_id, "ok": False, "error": {"kind": "reset"}, "attempts": 4}
    return dumps_line(obj) + "\n"


def test_scan_reads_our_lines_including_awkward_ids(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    ids = ["a", 7, -3, "7", 'quo"te', "中文", "back\\slash"]
    out.write_text("".join(line(i) for i in ids) + line("b", ok=False), encoding="utf-8")
    scan = scan_output(out, set(ids) | {"b"})
    assert scan.done == set(ids) and 7 in scan.done and "7" in scan.done
    assert scan.failed == {"b"} and scan.retry == 1
    assert scan.lines == 8 and not scan.foreign and not scan.needs_newline


def test_failed_then_ok_counts_as_done(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(line(1, ok=False) + line(1), encoding="utf-8")
    scan = scan_output(out, {1})
    assert scan.done == {1} and scan.retry == 0


def test_torn_tail_is_cut_off_so_the_file_stays_valid_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    torn = line("c")[:25]
    out.write_text(line("a") + line("b") + torn, encoding="utf-8")
    scan = scan_output(out, {"a", "b", "c"})
    assert scan.done == {"a", "b"} and scan.torn_tail and not scan.needs_newline
    repair_tail(scan)
    assert out.read_text("utf-8") == line("a") + line("b")
    with out.open("a", encoding="utf-8") as handle:
        handle.write(line("c"))
    again = scan_output(out, {"a", "b", "c"})
    assert again.done == {"a", "b", "c"} and again.unreadable == 0 and not again.torn_tail
    assert all(json.loads(x) for x in out.read_bytes().split(b"\n")[:-1])


def test_a_garbled_line_left_by_an_older_version_is_skipped(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(line("a") + line("b")[:20] + "\n" + line("b"), encoding="utf-8")
    scan = scan_output(out, {"a", "b"})
    assert scan.done == {"a", "b"} and scan.unreadable == 1 and scan.not_jsonl() is None


def test_whole_record_without_its_newline_counts(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(line("a") + line("b").rstrip("\n"), encoding="utf-8")
    scan = scan_output(out, {"a", "b"})
    assert scan.done == {"a", "b"} and not scan.torn_tail and scan.needs_newline


def test_foreign_lines_are_counted_with_an_example(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(line("a") + line("zzz") + '{"name": "not ours"}\n', encoding="utf-8")
    scan = scan_output(out, {"a"})
    assert scan.done == {"a"} and scan.foreign == 2 and "zzz" in scan.foreign_example


def test_hand_edited_lines_fall_back_to_json(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    pretty = json.dumps({"ok": True, "id": "x", "attempts": 1}) + "\n"  # other key order, spaces
    out.write_text(line("a") + pretty + "\n" + line("b", ok=False), encoding="utf-8")
    scan = scan_output(out, {"a", "b", "x"})
    assert scan.done == {"a", "x"} and scan.failed == {"b"} and not scan.unreadable


def test_missing_output_is_empty(tmp_path: Path) -> None:
    scan = scan_output(tmp_path / "nope.jsonl", {"a"})
    assert scan.lines == 0 and not scan.done and not scan.needs_newline


def test_kill_9_then_torn_line_then_rerun_loses_and_repeats_nothing(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 200)
    out = isolated / "out.jsonl"
    with start_mock(ttft_s=0.01, per_token_s=0.0005) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        args = ("--input", str(tasks), "--out", str(out), "-c", "4")
        with reaped(batch_process(isolated, *args)) as proc:
            wait_for_lines(out, 60, proc)
            kill_9(proc)
        raw = out.read_bytes()
        assert raw.endswith(b"\n")
        lines = raw.splitlines(keepends=True)
        assert 60 <= len(lines) < 200
        torn_id = json.loads(lines[-1])["id"]
        cut = lines[-1][: len(lines[-1]) // 2]  # the crash tore the last record in half
        out.write_bytes(b"".join(lines[:-1]) + cut)
        done_before = {json.loads(x)["id"] for x in lines[:-1]}

        result = cli("batch", "--input", str(tasks), "--out", str(out), "-c", "8", "--json")
    assert result.code == 0, result.err
    assert "torn" in result.err
    assert result.json["skipped"] == len(done_before)
    assert result.json["done"] == 200 - len(done_before)
    assert "cut off" in result.err
    raw_after = out.read_bytes()
    assert raw_after.startswith(b"".join(lines[:-1]))  # the torn half is gone: see rows
    rows = [json.loads(x.decode("utf-8")) for x in raw_after.split(b"\n")[:-1]]  # valid JSONL
    assert len(rows) == len(lines) - 1 + 200 - len(done_before)
    assert_each_item_once(out, 200)  # the torn item too, once
    assert torn_id not in done_before


def test_every_jsonl_reader_splits_on_newline_only(tmp_path: Path) -> None:
    from calibrate.io.jsonl import JsonlWriter, load_jsonl_objects, read_jsonl

    path = tmp_path / "records.jsonl"
    texts = ["a\u2028b", "c\u0085d", "e\u2029f\x1cg", "lone \ud800 surrogate"]
    with JsonlWriter(path) as writer:
        for i, text in enumerate(texts):
            writer.write({"id": i, "ok": True, "output": text, "attempts": 1})
    raw = path.read_bytes()
    raw.decode("utf-8")  # strictly valid UTF-8: the surrogate became U+FFFD
    assert raw.count(b"\n") == 4
    expected = [*texts[:3], "lone \ufffd surrogate"]
    assert [r["output"] for r in read_jsonl(path)] == expected
    assert [(n, o["output"]) for n, o in load_jsonl_objects(path)] == list(enumerate(expected, 1))
    scan = scan_output(path, {0, 1, 2, 3})
    assert scan.done == {0, 1, 2, 3} and scan.lines == 4 and not scan.unreadable
