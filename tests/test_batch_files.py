"""The files around a batch: piped input, --out checks, one writer per output, write errors,
and a server that never answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.batch_helpers import (
    assert_valid_jsonl,
    batch_process,
    ok_ids,
    results,
    wait_for_lines,
    write_tasks,
)
from tests.fakes import free_port
from tests.helpers import said, write_config
from tests.mockserver import REPO, start_mock


def _no_spool_left(folder: Path) -> bool:
    return not list(folder.glob("calibrate-input-*"))


def test_a_fifo_input_is_spooled_once_and_every_item_runs(
    cli, mock, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    spool_dir = isolated / "tmp"
    spool_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir))
    content = write_tasks(isolated / "source.jsonl", 25).read_bytes()
    fifo = isolated / "tasks.fifo"
    os.mkfifo(fifo)
    feeder = threading.Thread(target=fifo.write_bytes, args=(content,), daemon=True)
    feeder.start()
    result = cli("batch", "--input", str(fifo), "--out", "out.jsonl", "--json")
    feeder.join(5)
    assert result.code == 0, result.err
    assert result.json["done"] == 25 and sorted(ok_ids(isolated / "out.jsonl")) == sorted(
        f"t{i}" for i in range(25)
    )
    assert _no_spool_left(spool_dir)


def test_stdin_input_runs_every_item_and_an_empty_pipe_is_never_a_pass(isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 12)
    spool_dir = isolated / "tmp"
    spool_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env.update(PYTHONPATH=str(REPO), TMPDIR=str(spool_dir))
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        for source, expected in ((tasks.read_bytes(), 0), (b"", 2)):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "calibrate",
                    "batch",
                    "--input",
                    "/dev/stdin",
                    "--out",
                    "out.jsonl",
                ],
                input=source,
                cwd=isolated,
                env=env,
                capture_output=True,
                timeout=60,
            )
            assert proc.returncode == expected, proc.stderr.decode()
    assert sorted(ok_ids(isolated / "out.jsonl")) == sorted(f"t{i}" for i in range(12))
    assert b"holds no items" in proc.stderr
    assert _no_spool_left(spool_dir)


@pytest.mark.parametrize("extra", [["-c", "4"], ["-c", "1", "--retries", "0"], ["-c", "1"]])
def test_a_server_that_never_answers_exits_4_at_once_and_fails_nothing(
    cli, isolated: Path, extra: list[str]
) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    write_config(isolated / "calibrate.toml", base_url)
    tasks = write_tasks(isolated / "tasks.jsonl", 50)
    started = time.monotonic()
    result = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "--backoff-s", "0.2", *extra)
    took_s = time.monotonic() - started
    assert result.code == 4, result.err
    assert took_s < 3, f"{took_s:.1f} s: it should stop at once, not back off per item"
    assert f"no server at {base_url}" in result.err and "no item was marked failed" in result.err
    assert not results(isolated / "out.jsonl") if (isolated / "out.jsonl").exists() else True
    assert "Traceback" not in result.err


def test_a_second_run_on_the_same_out_exits_2_naming_the_holder(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 40)
    out = isolated / "out.jsonl"
    with start_mock(ttft_s=0.2, per_token_s=0.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        first = batch_process(isolated, "--input", str(tasks), "--out", str(out), "-c", "2")
        try:
            wait_for_lines(out, 1, first)
            before = out.read_bytes()
            second = cli("batch", "--input", str(tasks), "--out", str(out), "-c", "2")
            assert second.code == 2, second.err
            assert f"PID {first.pid}" in second.err and "in use by another run" in second.err
            assert out.read_bytes().startswith(before)
            first.send_signal(signal.SIGKILL)  # a dead holder leaves its lock file behind…
            first.communicate(timeout=10)
        finally:
            if first.poll() is None:
                first.kill()
                first.communicate()
        assert (isolated / "out.jsonl.lock").exists()
        third = cli("batch", "--input", str(tasks), "--out", str(out), "-c", "8", "--json")
    assert third.code == 0, third.err  # …which never blocks: the kernel dropped the lock
    assert Counter(ok_ids(out)) == Counter(f"t{i}" for i in range(40))
    assert not (isolated / "out.jsonl.lock").exists()


NOT_JSONL = {
    "csv": b"id,text\n1,hello\n2,world\n",
    "binary": bytes(range(256)) * 4,
    "pretty JSON": json.dumps([{"id": 1, "ok": True}], indent=2).encode(),
    "no final newline": b'{"id":1,"ok":true,"attempts":1}\nid,text',
    "a tasks file": b'{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n',
}


@pytest.mark.parametrize("case", [*sorted(NOT_JSONL), "hardlink", "symlink", "fifo"])
def test_an_out_that_is_the_input_or_not_a_results_file_exits_2_untouched(
    cli, mock, isolated: Path, case: str
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    out = isolated / "out.jsonl"
    if case == "hardlink":
        os.link(tasks, out)
    elif case == "symlink":
        out.symlink_to(tasks)
    elif case == "fifo":
        os.mkfifo(out)
    else:
        out.write_bytes(NOT_JSONL[case])
    before_tasks = tasks.read_bytes()
    before = None if case == "fifo" else out.read_bytes()
    sent = mock.model.snapshot().requests_total
    result = cli("batch", "--input", str(tasks), "--out", str(out))
    assert result.code == 2, result.err
    expected = {
        "hardlink": "same file as --input",
        "symlink": "same file as --input",
        "fifo": "not a regular file",
    }.get(case, "not a JSONL results file")
    assert expected in result.err and str(out) in result.err
    assert mock.model.snapshot().requests_total == sent
    assert tasks.read_bytes() == before_tasks
    if before is not None:
        assert out.read_bytes() == before
    assert not (isolated / "out.jsonl.lock").exists()


def test_an_unwritable_out_or_junit_exits_2_before_anything_is_sent(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    (isolated / "reports").mkdir()
    sent = mock.model.snapshot().requests_total
    cases = [
        (["--out", str(tasks / "out.jsonl")], "out.jsonl"),  # its folder is a file
        (["--out", "out.jsonl", "--junit", "reports"], "--junit reports is a directory"),
        (["--out", "out.jsonl", "--junit", str(tasks / "j.xml")], "is not a directory"),
    ]
    for args, message in cases:
        result = cli("batch", "--input", str(tasks), *args)
        assert result.code == 2, result.err
        assert message in result.err and "Traceback" not in result.err
        assert len(result.err.strip().splitlines()) <= 2
    assert mock.model.snapshot().requests_total == sent
    assert not (isolated / "out.jsonl").exists() or not results(isolated / "out.jsonl")


DISK_FULL = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
from calibrate.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_write_error_mid_run_exits_1_says_what_was_kept_and_a_rerun_completes(
    cli, isolated: Path
) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 60)
    out = isolated / "out.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                DISK_FULL,
                "batch",
                "--input",
                str(tasks),
                "--out",
                str(out),
                "-c",
                "2",
            ],
            cwd=isolated,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1, proc.stderr
        err = said(proc.stderr)
        assert "Traceback" not in err
        assert f"cannot write to {out}" in err and "File too large" in err
        assert "were neither done nor failed" in err and "kept in" in err
        # the writer that failed is closed at once, not waited on for its whole grace period
        assert "did not finish within" not in err, err
        kept = ok_ids(out)
        assert 0 < len(kept) < 60
        again = cli("batch", "--input", str(tasks), "--out", str(out), "--json")
    assert again.code == 0, again.err
    assert Counter(ok_ids(out)) == Counter(f"t{i}" for i in range(60))
    assert_valid_jsonl(out)


def test_concurrency_far_above_the_items_starts_one_worker_per_item(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    before = threading.active_count()
    peak = [before]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], threading.active_count())
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "-c", "4096", "--json")
    stop.set()
    watcher.join()
    assert result.code == 0, result.err
    assert peak[0] - before <= 3 + 8, f"{peak[0] - before} threads for 3 items"


def _long_line_file(path: Path, *, line: int, mib: int) -> Path:
    """``line - 1`` good tasks, then ``mib`` MiB with no newline (a JSON array, say)."""
    with path.open("wb") as handle:
        for i in range(1, line):
            handle.write(json.dumps({"id": i, "text": "t"}).encode() + b"\n")
        chunk = b'{"id": 3, "text": "c"},' * 4096
        handle.write(b"[")
        for _ in range(mib * 1024 * 1024 // len(chunk) + 1):
            handle.write(chunk)
    return path


_RUN_AND_REPORT_HWM = """
import sys
from calibrate.cli import main
try:
    code = main(sys.argv[1:])
finally:
    hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    sys.stderr.write("@@VmHWM " + hwm.split()[1] + "\\n")
sys.exit(code)
"""


def test_a_tasks_file_without_newlines_is_never_read_whole(isolated: Path) -> None:
    """A 64 MiB "line": exit 2 naming the file and the line, in bounded memory (it used to
    be read whole, then decoded and parsed: over 10× the file in RSS)."""
    tasks = _long_line_file(isolated / "array.jsonl", line=3, mib=64)
    (isolated / "out.jsonl").write_text("", "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    # the child's own high-water mark: ru_maxrss of a child counts the pages of this process
    # (a test worker grown large) it ran in before exec, and failed here at 170 MiB for that
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _RUN_AND_REPORT_HWM,
            "export",
            "--input",
            str(tasks),
            "--out",
            "out.jsonl",
            "--to",
            "final.jsonl",
        ],
        cwd=isolated,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    err = proc.stderr
    assert proc.returncode == 2, err
    assert f"{tasks} line 3: longer than 32 MiB without a newline" in err
    assert "Traceback" not in err
    hwm_kib = int(next(line for line in err.splitlines() if line.startswith("@@VmHWM")).split()[1])
    assert hwm_kib < 160 * 1024, f"{hwm_kib // 1024} MiB"


@pytest.mark.parametrize("line", [1, 2])
def test_batch_and_ladder_refuse_a_line_without_end_before_sending(
    cli, mock, isolated: Path, line: int
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = _long_line_file(isolated / "array.jsonl", line=line, mib=33)
    sent = mock.model.snapshot().requests_total
    for args in (
        ["batch", "--input", str(tasks), "--out", "out.jsonl"],
        ["ladder", "--force", "--tasks", str(tasks)],
    ):
        result = cli(*args)
        assert result.code == 2, result.err
        assert f"{tasks} line {line}: longer than 32 MiB" in result.err, result.err
        assert "Traceback" not in result.err
    assert mock.model.snapshot().requests_total == sent
    assert not (isolated / "out.jsonl").exists(), "a refused input leaves no --out behind"
