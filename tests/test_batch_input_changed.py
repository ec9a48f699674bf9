"""The input rewritten while a batch reads it (here: so that an id repeats) ends the run with a
defined code and says what happened — items were sent and their results kept — never "nothing
was sent and no output was written"; the verdict is recorded, --final is not written from an
input that is no longer the one the run was given, and a rerun resumes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.batch_helpers import batch_process, ok_ids, results, wait_for_lines, write_tasks
from tests.helpers import write_config
from tests.mockserver import start_mock


def test_an_input_rewritten_mid_run_is_said_and_nothing_is_lost(isolated: Path) -> None:
    with start_mock(ttft_s=0.01, per_token_s=0.002) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 150)
        original = tasks.read_bytes()
        proc = batch_process(
            isolated, "--input", "tasks.jsonl", "--out", "out.jsonl", "-c", "2",
            "--final", "final.jsonl",
        )  # fmt: skip
        wait_for_lines(isolated / "out.jsonl", 20, proc)
        first = original.split(b"\n", 1)[0] + b"\n"
        tasks.write_bytes(original + first)  # rewritten in place: id t0 now repeats
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 1, err
        assert "tasks.jsonl changed during the run" in err
        assert "result(s) of this run are" in err and "nothing is lost" in err
        assert "nothing was sent" not in err and "Traceback" not in err
        assert "--final final.jsonl not written: the input changed during the run" in err
        assert not (isolated / "final.jsonl").exists()
        ledger = [json.loads(x) for x in (isolated / "runs/ledger.jsonl").read_text().splitlines()]
        batch = [entry for entry in ledger if entry["stage"] == "batch"]
        assert batch and batch[-1]["passed"] is False
        assert "changed during the run" in batch[-1]["summary"]["input_changed"]
        sent = len(results(isolated / "out.jsonl"))
        assert sent >= 20
        # the input put back: a rerun resumes, every item once ok, --final written
        tasks.write_bytes(original)
        rerun = batch_process(
            isolated, "--input", "tasks.jsonl", "--out", "out.jsonl", "--final", "final.jsonl"
        )
        _, err = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, err
        assert sorted(set(ok_ids(isolated / "out.jsonl"))) == sorted(f"t{i}" for i in range(150))
        assert len(results(isolated / "final.jsonl")) == 150
