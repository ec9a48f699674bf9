"""Every read of a file, pipe or device is bounded while it is read (docs/guarantees.md): a
line at most 32 MiB, a file read whole at most 32 MiB, exit 2 at the bound naming the file,
read no further, and no temporary copy left behind — whatever the reader (batch input,
journal, baseline, config, run-folder files, record files, the ledger).

The readers run in a child limited to 1 GiB of address space and 256 MiB a file written: one
that reads or copies without bound fails there (MemoryError, EFBIG, or the hang guard) instead
of eating the shared machine's memory or disk."""

from __future__ import annotations

import ast
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from calibrate.io.bounded import TooLong, read_bounded
from tests.batch_helpers import write_tasks
from tests.helpers import write_config
from tests.mockserver import REPO

ADDRESS_SPACE = 1 << 30
FILE_SIZE = 256 << 20
HANG_GUARD_S = 120  # not a timing assertion: a reader without bound never ends on /dev/zero


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE, FILE_SIZE))


def _env(tmpdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env.update(PYTHONPATH=str(REPO), TMPDIR=str(tmpdir))
    return env


def _calibrate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    tmpdir = cwd / "tmp"
    tmpdir.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "calibrate", *args],
        cwd=cwd,
        env=_env(tmpdir),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        preexec_fn=_limited,
        check=False,
    )


def _run_folder(root: Path) -> Path:
    run = root / "runs/20261129T164129Z-ladder-a1b2c3"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"stage": "ladder"}', "utf-8")
    (run / "tiers.csv").write_text(
        "batch_size,concurrency,rounds,items,errors,verdict\n1,1,2,2,0,pass\n", "utf-8"
    )
    return run


def _zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


# (name, how the files are laid out, argv, exit code, what stderr names)
CASES = {
    "batch --input a device": (
        lambda root: None,
        ["batch", "--input", "/dev/zero", "--out", "out.jsonl"],
        2,
        "/dev/zero line 1: longer than 32 MiB",
    ),
    "batch --out journal without newlines": (
        lambda root: os.truncate(root / "out.jsonl", 900 << 20),  # sparse: no disk used
        ["batch", "--input", "tasks.jsonl", "--out", "out.jsonl"],
        2,
        "out.jsonl line 1: longer than 32 MiB",
    ),
    "export --input a device": (
        lambda root: None,
        ["export", "--input", "/dev/zero", "--out", "out.jsonl", "--to", "final.jsonl"],
        2,
        "/dev/zero line 1: longer than 32 MiB",
    ),
    "export --out a device": (
        lambda root: None,
        ["export", "--input", "tasks.jsonl", "--out", "/dev/zero", "--to", "final.jsonl"],
        2,
        "/dev/zero line 1: longer than 32 MiB",
    ),
    "export --out journal without newlines": (
        lambda root: os.truncate(root / "out.jsonl", 900 << 20),
        ["export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "final.jsonl"],
        2,
        "out.jsonl line 1: longer than 32 MiB",
    ),
    "report: tiers.csv a device": (
        lambda root: _zero(_run_folder(root) / "tiers.csv"),
        ["report", "runs/20261129T164129Z-ladder-a1b2c3", "--no-plot"],
        2,
        "tiers.csv is over 32 MiB",
    ),
    "report: summary.json a device": (
        lambda root: _zero(_run_folder(root) / "summary.json"),
        ["report", "runs/20261129T164129Z-ladder-a1b2c3", "--no-plot"],
        2,
        "summary.json is over 32 MiB",
    ),
    "repro: record files are devices": (
        lambda root: None,
        ["repro", "/dev/zero", "/dev/zero"],
        2,
        "/dev/zero line 1: longer than 32 MiB",
    ),
    "verify: the baseline a device": (
        lambda root: _zero(root / "baselines/single.jsonl"),
        ["verify"],
        2,
        "not a regular file",
    ),
    "single --save-baseline: the old baseline a device": (
        lambda root: _zero(root / "baselines/single.jsonl"),
        ["single", "--save-baseline"],
        2,
        "single.jsonl is over 32 MiB",
    ),
    "status: the ledger a device": (
        lambda root: _zero(root / "runs/ledger.jsonl"),
        ["status"],
        0,
        "not a regular file",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_reader_stops_at_the_bound_and_exits_2_naming_the_file(
    mock, isolated: Path, case: str
) -> None:
    lay_out, argv, code, needle = CASES[case]
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 3)
    (isolated / "out.jsonl").write_bytes(b"")
    (isolated / "runs").mkdir(exist_ok=True)
    (isolated / "baselines").mkdir(exist_ok=True)
    lay_out(isolated)
    proc = _calibrate(isolated, *argv)
    assert proc.returncode == code, proc.stderr
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    assert not list((isolated / "tmp").iterdir())  # no temporary copy left behind
    assert not (isolated / "final.jsonl").exists()


def test_a_pipe_is_copied_under_the_bound_and_leaves_no_copy_even_when_killed(
    isolated: Path,
) -> None:
    """A FIFO is copied while it is read (its writer still writing): the copy has no name in
    $TMPDIR at any moment, so a kill -9 mid-copy leaves nothing behind (it used to leave a
    calibrate-input-*.jsonl of whatever had been copied: 52 GB from /dev/zero in 16 s)."""
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    fifo = isolated / "tasks.fifo"
    os.mkfifo(fifo)
    tmpdir = isolated / "tmp"
    tmpdir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "calibrate", "batch", "--input", str(fifo), "--out", "o.jsonl"],
        cwd=isolated,
        env=_env(tmpdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_limited,
    )
    try:
        with fifo.open("wb") as writer:  # opens once calibrate opens the other end
            line = json.dumps({"id": 0, "text": "x" * 4000}).encode() + b"\n"
            for i in range(2000):  # 8 MB: well past any pipe buffer, so it is being copied
                writer.write(line.replace(b'"id": 0', f'"id": {i}'.encode()))
            writer.flush()
            deadline = time.monotonic() + HANG_GUARD_S
            while proc.poll() is None and time.monotonic() < deadline:
                if not list(tmpdir.iterdir()) and _has_read(proc.pid, 4 << 20):
                    break
                time.sleep(0.05)
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert not list(tmpdir.iterdir()), list(tmpdir.iterdir())  # nothing named
            proc.send_signal(signal.SIGKILL)
            proc.wait(HANG_GUARD_S)
    except BrokenPipeError:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert not list(tmpdir.iterdir())


def _has_read(pid: int, size: int) -> bool:
    """Whether process ``pid`` has read ``size`` bytes (from /proc/PID/io)."""
    try:
        text = Path(f"/proc/{pid}/io").read_text("ascii")
    except OSError:
        return False
    fields = dict(line.split(": ") for line in text.splitlines() if ": " in line)
    return int(fields.get("rchar", "0")) >= size


# Readers that may open a file directly: each reads with a bound of its own, or reads what
# the kernel writes (/proc). Any other read goes through calibrate/io/bounded.py.
ALLOWED = {
    "calibrate/io/bounded.py": "the bounded reader itself",
    "calibrate/io/atomic.py": "/proc/self/status (the umask)",
    "calibrate/io/jsonl.py": "read_jsonl: regular files only, lines through lines_or_skipped",
    "calibrate/io/journal/scan.py": "blocks, the carry bounded by MAX_LINE_BYTES",
    "calibrate/stages/export/scan.py": "blocks, the carry bounded by MAX_LINE_BYTES",
    "calibrate/config/file.py": "reads CONFIG_MAX_BYTES + 1 at most",
    "calibrate/state/ledger.py": "regular files only, lines through lines_or_skipped",
    "calibrate/report/tune_report.py": "one header line, readline(HEADER_BYTES)",
    "calibrate/stages/tune/store.py": "the last line, from MAX_LINE_BYTES before the end",
    "calibrate/server/pids.py": "/proc",
    "calibrate/server/devices.py": "/proc",
    "calibrate/gpu/selfload.py": "/proc",
}
READS = {"read_text", "read_bytes", "copy", "copy2", "copyfile", "copyfileobj"}


def test_no_reader_outside_the_bounded_one_reads_a_file_whole() -> None:
    """A new ``read_text``, ``read_bytes``, ``shutil.copy…`` or ``open(…)`` for reading in
    the package fails here until it goes through calibrate/io/bounded.py (or says why not)."""
    found = []
    package = REPO / "calibrate"
    for path in sorted(package.rglob("*.py")):
        name = str(path.relative_to(REPO))
        if name in ALLOWED or name.startswith("calibrate/mock/"):
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in READS and not (called == "read_text" and _is_bounded(func)):
                found.append(f"{name}:{node.lineno} {called}")
            elif called == "open" and _reads(node):
                found.append(f"{name}:{node.lineno} open")
    assert not found, found


def _is_bounded(func: ast.expr) -> bool:
    """``read_text(path)`` imported from calibrate.io.bounded is a plain name, not a method."""
    return isinstance(func, ast.Name)


def _reads(node: ast.Call) -> bool:
    """An ``open`` / ``Path.open`` call whose mode reads (no mode, or one without w/a/x/+)."""
    func = node.func
    not_files = ("os", "tempfile", "NvmlSampler", "gate")
    if isinstance(func, ast.Attribute) and getattr(func.value, "id", "") in not_files:
        return False
    mode_arg = node.args[0] if node.args and isinstance(func, ast.Attribute) else None
    if not isinstance(func, ast.Attribute) and len(node.args) > 1:
        mode_arg = node.args[1]
    for keyword in node.keywords:
        if keyword.arg == "mode":
            mode_arg = keyword.value
    if mode_arg is None:
        return True
    if isinstance(mode_arg, ast.Constant) and isinstance(mode_arg.value, str):
        return not any(c in mode_arg.value for c in "wax+")
    return False


def test_a_file_read_whole_is_read_to_its_end_or_refused_past_the_bound(tmp_path: Path) -> None:
    """``read_bounded`` reads in pieces the size the file says it has, or 64 KiB where it says
    none (/proc's files, a pipe): every byte up to the bound comes back, one past it is
    refused — whatever the pieces."""
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * 1000)
    assert read_bounded(exact, limit=1000) == b"x" * 1000
    with pytest.raises(TooLong, match="exact is over"):
        read_bounded(exact, limit=999)
    stat = Path(f"/proc/{os.getpid()}/stat")
    if stat.exists():  # says 0 bytes, holds a line
        assert read_bounded(stat).startswith(f"{os.getpid()} (".encode())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    body = bytes(range(256)) * 800  # 204,800 bytes: several pieces of unknown size
    for limit, whole in ((len(body), True), (len(body) - 1, False)):
        writer = threading.Thread(target=fifo.write_bytes, args=(body,))
        writer.start()
        try:
            if whole:
                assert read_bounded(fifo, limit=limit) == body
            else:
                with pytest.raises(TooLong):
                    read_bounded(fifo, limit=limit)
        finally:
            writer.join(timeout=10)
