"""Shared fixtures: an isolated working directory, a scrubbed environment, the CLI in-process."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calibrate.cli import main
from calibrate.cli.lines import unfit
from calibrate.cli.output import log_width
from calibrate.server import process
from calibrate.server.process import start_stop
from tests.helpers import CliResult

# A suite started in the background by a non-interactive shell (`make test &`, nohup, some CI
# runners) inherits SIGINT ignored, and so would every calibrate it starts: the Ctrl-C tests
# would then watch calibrate ignore Ctrl-C. A handler (not SIG_IGN) is reset to the default in
# each child at exec, so the children get Python's own Ctrl-C again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test runs in its own empty directory with no calibrate settings inherited; a server
    it left running under calibrate's management is stopped (and its supervisor reaped) after.

    COLUMNS and LINES go too: tables in a log are 100 columns wide unless $COLUMNS says otherwise,
    and the terminal that runs pytest (or pytest-xdist, which sets COLUMNS=80 in its workers)
    must not decide which columns a test reads."""
    import os

    scrubbed = ("OPENAI_API_KEY", "NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")
    for name in list(os.environ):
        if name.startswith("CALIBRATE_") or name in scrubbed:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    record = process.load(tmp_path / "runs")
    if record is not None and process.liveness(record) == "running":
        start_stop.stop(record, 10.0)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Any:
    """Run ``calibrate ARGS`` in-process and capture its exit code, stdout and stderr."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        said = unfit(captured.err, log_width())
        return CliResult(code, captured.out, said, printed=captured.err)

    return run


@pytest.fixture
def mock() -> Iterator[Any]:
    """The built-in mock on a free port, fast latencies."""
    from tests.mockserver import start_mock

    with start_mock(ttft_s=0.002, per_token_s=0.0005) as server:
        yield server


@pytest.fixture
def repo_on_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkout on PYTHONPATH, for the tests whose children (a managed mock engine, a
    pinned launch script) run ``python -m calibrate`` or ``tests.*`` from another directory."""
    from tests.fakes import pythonpath_env

    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
