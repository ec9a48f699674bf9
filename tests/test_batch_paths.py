"""Paths as a batch records and shows them: a file name that is not UTF-8 (GBK bytes on a UTF-8
system) is written as its bytes (\\xNN) in the ledger, summary.json and the manifest — never
U+FFFD, which names no file — and a resume command quotes it so that a shell finds the same file;
a piped --input, gone after the run, is named as such, with what to pass instead."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from pathlib import Path

from tests.batch_helpers import write_tasks
from tests.helpers import write_config

GBK_NAME = b"\xd6\xd0\xce\xc4.jsonl"  # "中文.jsonl" in GBK: not UTF-8


def test_a_journal_named_in_gbk_is_recorded_and_quoted_by_its_bytes(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 4)
    out = os.fsdecode(GBK_NAME)
    result = cli("batch", "--input", "tasks.jsonl", "--out", out, "--limit", "2", "--json")
    assert result.code == 0, result.err
    assert (isolated / out).exists()
    shown = "\\xd6\\xd0\\xce\\xc4.jsonl"
    ledger = (isolated / "runs/ledger.jsonl").read_bytes()
    run = isolated / "runs" / result.json["run_id"]
    for raw in (ledger, (run / "summary.json").read_bytes(), (run / "manifest.json").read_bytes()):
        text = raw.decode("utf-8")  # strictly UTF-8
        assert "\ufffd" not in text
    entry = json.loads(ledger.splitlines()[-1])
    assert entry["summary"]["out"] == shown
    assert shown in json.loads((run / "manifest.json").read_text("utf-8"))["command"]
    # the resume command names the same file when pasted into a shell
    resume = result.json["resume_command"]
    word = re.search(r"\$'[^']*'", resume)
    assert word is not None, resume
    found = subprocess.run(["bash", "-c", f"test -f {word.group()}"], cwd=isolated, check=False)
    assert found.returncode == 0, resume


def test_a_piped_input_is_named_as_a_pipe_with_what_to_pass_instead(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    content = write_tasks(isolated / "source.jsonl", 5).read_bytes()
    fifo = isolated / "tasks.fifo"
    os.mkfifo(fifo)
    feeder = threading.Thread(target=fifo.write_bytes, args=(content,), daemon=True)
    feeder.start()
    result = cli("batch", "--input", str(fifo), "--out", "out.jsonl", "--limit", "2", "--json")
    feeder.join(5)
    assert result.code == 0, result.err
    assert f"--input {fifo} was a pipe, read once" in result.err
    assert "save its items to a file and give that as --input" in result.err
    resume = result.json["resume_command"]
    assert "--input TASKS.jsonl" in resume and str(fifo) not in resume
