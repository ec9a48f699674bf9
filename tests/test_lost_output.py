"""A result that could not be written is not a success, and says which file it could not write.

- stdout that cannot take what a command writes there (``--json > /dev/full``, a full disk) is
  exit 1 for every command, saying the result is lost; a reader that left (``| head``) is not;
- a full disk (every write past 0 bytes fails: RLIMIT_FSIZE 0 in the child) ends every
  command that writes — report, export, pin, init, single, ladder, sweep, batch --final — with
  one exit code (1), the file named, and nothing half-written left behind: no empty plot.png,
  no final file without its failed list, no empty scripts/ or run folder.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from calibrate.cli import main
from tests.helpers import write_config
from tests.mockserver import REPO, start_mock

LEVELS = (
    "[ladder]\nbatch_sizes = [1, 2]\nrounds = 1\nmin_round_s = 0\n"
    "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.05\nrepeats = 1\n"
    '[server]\nkind = "custom"\ncommand = "engine --port {port}"\n'
)


def _calibrate(root: Path, args: str, **how: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "calibrate", *args.split()],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
        timeout=120,
        check=False,
        **how,  # type: ignore[call-overload]
    )


@pytest.fixture(scope="module")
def calibrated_template(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Once a module: a target with a baseline, a passing ladder and sweep, a tasks file and a
    journal, calibrated against a mock that serves the whole module (each test gets a copy)."""
    root = tmp_path_factory.mktemp("calibrated")
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as mock, pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.startswith("CALIBRATE_") or name == "OPENAI_API_KEY":
                env.delenv(name)
        env.chdir(root)
        write_config(root / "calibrate.toml", mock.base_url, LEVELS)
        (root / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n')
        with open(os.devnull, "w") as quiet, redirect_stdout(quiet), redirect_stderr(quiet):
            for args in ("single", "repro --runs 1", "ladder", "sweep"):
                assert main(args.split()) == 0, args
            assert main(["batch", "--input", "tasks.jsonl", "--out", "out.jsonl"]) == 0
        yield root


@pytest.fixture
def calibrated(calibrated_template: Path, isolated: Path) -> Path:
    """The module's calibrated target, copied into this test's own directory."""
    shutil.copytree(calibrated_template, isolated, dirs_exist_ok=True, symlinks=True)
    return isolated


def _run_of(root: Path, stage: str) -> str:
    return next(str(p.relative_to(root)) for p in sorted((root / "runs").glob(f"*-{stage}-*")))


STDOUT_COMMANDS = [
    "status --json",
    "status --show-config --json",
    "single --json",
    "export --input tasks.jsonl --out out.jsonl --to final.jsonl --json",
    "report {ladder} --no-plot --json",
    "server status --json",
]


@pytest.mark.parametrize("command", STDOUT_COMMANDS)
def test_a_result_stdout_could_not_take_is_exit_1(
    calibrated: object, isolated: Path, command: str
) -> None:
    args = command.format(ladder=_run_of(isolated, "ladder"))
    with open("/dev/full", "w") as full:
        done = _calibrate(isolated, args, stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 1, done.stderr
    assert "the output to stdout could not be written (No space left on device)" in done.stderr
    assert "Traceback" not in done.stderr
    with subprocess.Popen(  # a reader that leaves early is its own choice: no failure
        [sys.executable, "-m", "calibrate", *args.split()],
        cwd=isolated,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as proc:
        assert proc.stdout is not None
        proc.stdout.close()
        assert proc.wait(timeout=120) == 0


def _no_room() -> None:  # in the child: every write past 0 bytes fails (EFBIG), as on a full disk
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _files(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_size if p.is_file() else -1
        for p in root.rglob("*")
        if "locks" not in p.parts  # a target's lock file is kept between runs, by design
    }


FULL_DISK = {
    "report {ladder}": "{ladder}/plot.png",
    "report {ladder} --no-plot --html": "{ladder}/report.html",
    "report {ladder} --timeline 1": "{ladder}/plot.png",
    "export --input tasks.jsonl --out out.jsonl --to final.csv": "final.csv",
    "export --input tasks.jsonl --out out.jsonl --to new/final.jsonl": "new/final.jsonl",
    "pin --kind custom": "scripts/launch.sh",
    "pin --kind custom --out new/launch.sh": "new/launch.sh",
    "init new.toml": "new.toml",
    "single": "runs/",
    "repro --runs 1": "runs/",
    "ladder --force": "runs/",
    "sweep --force": "runs/",
    "batch --input tasks.jsonl --out out.jsonl --final final.csv": "runs/ledger.jsonl",
}


@pytest.mark.parametrize("command", sorted(FULL_DISK))
def test_a_full_disk_is_exit_1_naming_the_file_with_nothing_half_written(
    calibrated: object, isolated: Path, command: str
) -> None:
    ladder = _run_of(isolated, "ladder")
    args, file = command.format(ladder=ladder), FULL_DISK[command].format(ladder=ladder)
    before = _files(isolated)
    done = _calibrate(isolated, args, capture_output=True, preexec_fn=_no_room)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{file}" in done.stderr and "File too large" in done.stderr, done.stderr
    after = _files(isolated)
    left = {name: size for name, size in after.items() if before.get(name) != size}
    assert left == {}, f"left behind: {left}"


def _room_for(size: int):  # type: ignore[no-untyped-def]
    """In the child: files may grow to ``size`` bytes and no further (a disk that fills up)."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def test_a_disk_that_fills_mid_line_leaves_the_ledger_whole_and_later_commands_quiet(
    calibrated: Path,
) -> None:
    """The disk filled while `single` appended its ledger line: the line was cut after 64 bytes
    and every later command warned "skipping line 6 of runs/ledger.jsonl: not JSON", for good.
    Now a write that fails takes back what it wrote: the ledger is as it was, nothing warns."""
    ledger = calibrated / "runs" / "ledger.jsonl"
    before = ledger.read_bytes()
    done = _calibrate(
        calibrated, "single", capture_output=True, preexec_fn=_room_for(len(before) + 64)
    )
    assert done.returncode == 1, done.stderr
    assert "ledger.jsonl" in done.stderr and "File too large" in done.stderr, done.stderr
    assert ledger.read_bytes() == before
    after = _calibrate(calibrated, "status", capture_output=True)
    assert after.returncode == 0, after.stderr
    assert "skipping line" not in after.stderr, after.stderr


@pytest.mark.parametrize("fsync", [False, True])
def test_a_record_the_disk_cut_short_is_taken_back_whole(tmp_path: Path, fsync: bool) -> None:
    """A run's records.jsonl, a batch's --out, a tune's results: a record that could not be
    written whole is not left as a torn line for the next reader to trip on."""
    path = tmp_path / "records.jsonl"
    path.write_bytes(b'{"n":1}\n')
    code = (
        "import sys; from pathlib import Path; from calibrate.io.jsonl import JsonlWriter\n"
        f"w = JsonlWriter(Path({str(path)!r}), fsync={fsync})\n"
        "try:\n    w.write({'text': 'x' * 200})\nexcept OSError as e:\n    print(e.filename)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=_room_for(len(b'{"n":1}\n') + 40),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(path)
    assert path.read_bytes() == b'{"n":1}\n'
