"""The llama.cpp suite: the real CLI managing a real `llama-server` (make test-engine ENGINE=llamacpp).

calibrate starts and stops the server itself ([server] kind = "llamacpp"); the binary comes from
the cache scripts/engine_llamacpp.sh builds, put first on PATH. Its absence fails the suite.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from calibrate.cli import main
from calibrate.server import process
from tests.engine_llamacpp.helpers import GGUF, free_port, write_llamacpp_config


@pytest.fixture(scope="session")
def llamacpp_bin() -> Path:
    """The built llama-server; its absence is a failure, never a skip."""
    folder = os.environ.get("LLAMACPP_BIN_DIR")
    if not folder:
        pytest.fail(
            "LLAMACPP_BIN_DIR is not set: run this suite with `make test-engine ENGINE=llamacpp`"
        )
    binary = Path(folder) / "llama-server"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no executable llama-server in {folder}: scripts/engine_llamacpp.sh install")
    if not GGUF.is_file():
        pytest.fail(f"no {GGUF}: scripts/engine_llamacpp.sh build-model")
    return binary


@pytest.fixture(autouse=True)
def _llama_server_on_path(llamacpp_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{llamacpp_bin.parent}{os.pathsep}{os.environ['PATH']}")
    # One compute thread: on a shared 2-core machine ggml's two threads spin on a barrier, and
    # when another process takes a core every token waits a scheduler slice (seconds per request).
    # llama-server reads LLAMA_ARG_* for flags not on its command line; calibrate's env is inherited.
    monkeypatch.setenv("LLAMA_ARG_THREADS", os.environ.get("LLAMA_ARG_THREADS", "1"))


@pytest.fixture
def llama(isolated: Path) -> Iterator[str]:
    """calibrate.toml for a managed llama-server on a free port; whatever runs is stopped after."""
    port = free_port()
    write_llamacpp_config(isolated, port)
    yield f"http://127.0.0.1:{port}"
    record = process.load(isolated / "runs")
    if record is not None and process.liveness(record) == "running":
        assert main(["server", "stop"]) == 0, "the managed llama-server did not stop"
