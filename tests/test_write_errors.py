"""Write errors are one-line messages naming the path: exit 2 before anything is sent, exit 1
(saying what was kept) once the stage ran; out of memory is a clean exit too."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.helpers import write_config
from tests.mockserver import start_mock

JUNIT_STAGES = ["single", "repro", "ladder", "sweep", "rollback", "verify"]


@pytest.mark.parametrize("stage", JUNIT_STAGES)
def test_unwritable_junit_path_is_exit_2_before_anything_is_sent(
    cli, isolated: Path, stage: str
) -> None:
    (isolated / "reports").mkdir()
    (isolated / "afile").write_text("x")
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        for junit, why in (("reports", "is a directory"), ("afile/x.xml", "not a directory")):
            result = (
                cli(stage, "--force", "--junit", junit)
                if stage != "single"
                else cli(stage, "--junit", junit)
            )
            assert result.code == 2, result.err
            assert junit in result.err and why in result.err
            assert "Traceback" not in result.err and len(result.err.strip().splitlines()) <= 2
        assert mock.model.snapshot().requests_total == 0
    assert not (isolated / "runs").exists()


def test_unwritable_runs_folder_is_exit_2_and_nothing_is_sent(cli, isolated: Path) -> None:
    (isolated / "afile").write_text("x")
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, '[paths]\nruns = "afile/runs"\n')
        result = cli("single")
        assert result.code == 2, result.err
        assert "afile/runs" in result.err and "nothing was sent" in result.err
        assert mock.model.snapshot().requests_total == 0


def test_disk_full_after_the_stage_ran_is_exit_1_saying_what_was_kept(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from calibrate.io import jsonl

    def full(self: object, obj: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        monkeypatch.setattr(jsonl.JsonlWriter, "write", full)
        result = cli("single")
    assert result.code == 1, result.err
    assert "No space left on device" in result.err and "kept" in result.err
    assert "Traceback" not in result.err


def test_out_of_memory_is_a_clean_exit_1(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from calibrate.stages import single_run

    def huge(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(single_run, "run_single", huge)
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        result = cli("single")
    assert result.code == 1
    assert "out of memory" in result.err and "Traceback" not in result.err


def test_init_never_creates_folders_and_names_the_path(cli, isolated: Path) -> None:
    missing = cli("init", "nonexistent/dir/x.toml")
    assert missing.code == 2 and "nonexistent/dir does not exist" in missing.err
    assert not (isolated / "nonexistent").exists()
    (isolated / "afile").write_text("x")
    under_file = cli("init", "afile/x.toml")
    assert under_file.code == 2 and "afile is not a directory" in under_file.err
    assert "Traceback" not in missing.err + under_file.err
    assert cli("init", "calibrate.toml").code == 0


# --- files written atomically get the mode the umask gives, not mkstemp's 0600 -----------


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_written_atomically_follow_the_umask(isolated: Path, umask: int) -> None:
    import os
    import stat
    import subprocess
    import sys

    from tests.mockserver import REPO

    (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n', "utf-8")
    (isolated / "out.jsonl").write_text('{"id":1,"ok":true,"output":"x","attempts":1}\n', "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    for args in (
        ["init", "calibrate.toml"],
        ["export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "final.csv"],
        ["export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "final.jsonl"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "calibrate", *args],
            cwd=isolated,
            env=env,
            umask=umask,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    for name in ("calibrate.toml", "final.csv", "final.jsonl", "final.failed.jsonl"):
        mode = stat.S_IMODE((isolated / name).stat().st_mode)
        assert mode == 0o666 & ~umask, (name, oct(mode), oct(umask))


# --- pin: the script is written, then the pin cannot be recorded ---------------------------


@pytest.mark.parametrize(
    ("code", "why"), [(errno.EACCES, "Permission denied"), (errno.ENOSPC, "No space left")]
)
def test_pin_whose_ledger_cannot_be_written_says_the_script_was_written_but_not_recorded(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, code: int, why: str
) -> None:
    from calibrate.state import ledger
    from tests.fakes import passing_ladder

    server = '[server]\nkind = "vllm"\nmodel_path = "/models/m"\nport = 8123\n'
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    target = str(cli("status", "--json").json["target"])
    passing_ladder(isolated, target, batch_size=4)

    def unwritable(path: Path, obj: object) -> None:  # a read-only ledger, or a full disk
        raise OSError(code, why, str(path))

    monkeypatch.setattr(ledger, "append_jsonl", unwritable)
    result = cli("pin")
    assert result.code == 1, result.err
    lines = result.err.strip().splitlines()
    assert "Traceback" not in result.err and len(lines) == 2, result.err
    assert lines[0].startswith("error: pin wrote scripts/launch.sh but could not record it")
    assert "runs/ledger.jsonl" in lines[0] and why in lines[0]
    assert lines[1] == "Free space or fix permissions, then run it again: calibrate pin"
    assert (isolated / "scripts/launch.sh").is_file()
    monkeypatch.undo()
    assert "pin" not in cli("status", "--json").json["stages"], "nothing pinned in the ledger"


# --- a ledger no result can be recorded in: exit 2 before anything is sent -----------------


@pytest.mark.parametrize("kind", ["a folder", "a FIFO", "a link to /dev/null"])
def test_a_ledger_that_is_not_a_regular_file_is_exit_2_before_anything_is_sent(
    cli, isolated: Path, kind: str
) -> None:
    import os

    ledger = isolated / "runs" / "ledger.jsonl"
    ledger.parent.mkdir()
    if kind == "a folder":
        ledger.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(ledger)
    else:
        ledger.symlink_to("/dev/null")
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        for stage in ("single", "repro", "batch"):
            args = ["--input", "tasks.jsonl", "--out", "out.jsonl"] if stage == "batch" else []
            (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n', "utf-8")
            result = cli(stage, "--force", *args) if stage == "repro" else cli(stage, *args)
            assert result.code == 2, (stage, result.err)
            assert "Traceback" not in result.err and "[Errno" not in result.err
            assert f"the ledger {ledger.relative_to(isolated)} is" in result.err, result.err
            assert "nothing was sent" in result.err
        assert mock.model.snapshot().requests_total == 0
    assert sorted(p.name for p in (isolated / "runs").iterdir()) == ["ledger.jsonl"]
