"""A process that runs stages one after another (``calibrate run`` walks them in one process; the
tests run every command in theirs) ends each stage with the descriptors it began with: a stage's
kept-alive connection to the server is closed when the stage ends, not left for the process's
exit. Before, each single, repro and verify left one socket open: a process that ran them a few
hundred times held a few hundred sockets to the server."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from calibrate.http.aio.bridge import shared_loop
from tests.helpers import write_config
from tests.mockserver import start_mock_process


def _descriptors() -> dict[str, str]:
    """This process's open descriptors, once the I/O loop has run what it was handed (a client's
    close reaches it as a callback): the same count every time nothing was left open."""
    for _ in range(3):
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), shared_loop().loop).result(10)
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
    return found


def test_single_repro_and_verify_run_again_and_again_hold_no_more_descriptors(
    cli, isolated: Path
) -> None:
    # the mock in its own process: every descriptor counted here is calibrate's
    with start_mock_process("--ttft", "0.001", "--per-token", "0.0002") as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        assert cli("single", "--save-baseline").code == 0  # the I/O loop started, the baseline
        before = _descriptors()
        for _ in range(3):
            for stage in ("single", "repro", "verify"):
                result = cli(stage)
                assert result.code == 0, result.err
        after = _descriptors()
    grown = {fd: what for fd, what in after.items() if before.get(fd) != what}
    assert len(after) <= len(before), grown
