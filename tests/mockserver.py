"""Start the mock server for a test: in a background thread, or as a real subprocess."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from types import TracebackType
from typing import Any, Self

from calibrate.mock import BackgroundServer, MockModel, MockSettings
from tests.helpers import REPO

LISTENING = "mock listening on "


class RunningMock:
    """A mock serving on 127.0.0.1:<free port> from a thread of the test process."""

    def __init__(self, settings: MockSettings, port: int = 0) -> None:
        self.settings = settings
        self._background = BackgroundServer(settings, "127.0.0.1", port)
        self.port = self._background.server.port
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.model: MockModel = self._background.server.model

    def stop(self) -> None:
        """The server's loop looks for a shutdown between polls of its socket (every 50 ms):
        each stop waited that long, of several hundred in the suite. A connection wakes the poll
        at once; the mock's handler sees it close before any request, as a port probe's."""
        asking = threading.Thread(target=self._background.server.shutdown, daemon=True)
        asking.start()
        while asking.is_alive():
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            asking.join(0.005)
        self._background.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_mock(*, port: int = 0, **settings: Any) -> RunningMock:
    """``start_mock(ttft_s=0.001, slots=2)``: keyword arguments are MockSettings fields.

    ``port`` restarts a mock where an earlier one listened (same base_url, same target).
    """
    if isinstance(settings.get("models"), str):
        settings["models"] = (settings["models"],)
    return RunningMock(MockSettings(**settings), port)


class MockProcess:
    """``python -m calibrate mock --port 0 ...`` running as a child process."""

    def __init__(self, *cli_args: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "calibrate", "mock", "--port", "0", *cli_args],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.startswith(LISTENING):
            self.stop()
            raise RuntimeError(f"mock did not start: {line!r}")
        self.base_url = line.removeprefix(LISTENING)
        self.port = int(self.base_url.rsplit(":", 1)[1].split("/", 1)[0])
        self.pid = self._proc.pid
        self.returncode: int | None = None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int:
        """Signal the process, wait for it, close its pipe; returns its exit code."""
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self.returncode = self._proc.returncode
        return self.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_mock_process(*cli_args: str) -> MockProcess:
    """``start_mock_process("--slots", "2")``: flags as for ``calibrate mock``."""
    return MockProcess(*cli_args)
