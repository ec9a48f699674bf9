"""The llama.cpp suite: the real CLI managing a real `llama-server` (make test-engine ENGINE=llamacpp).

calibrate starts and stops the server itself ([server] kind = "llamacpp"); the binary comes from
the cache scripts/engine_llamacpp.sh builds, put first on PATH. Its absence fails the suite.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from calibrate.cli import main
from calibrate.server import process

REPO = Path(__file__).resolve().parents[2]
GGUF = REPO / "tests/engine/model.gguf"
MODEL_NAME = "tiny-llama"  # llama.cpp serves it under the --alias calibrate passes
PROMPT = "What is 2 plus 3?"
LONG_PROMPT = "Count to 100."  # about 100 tokens of answer: enough work for a real knee


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_llamacpp_config(
    root: Path,
    port: int,
    *,
    prompt: str = PROMPT,
    max_tokens: int = 32,
    batch_sizes: str = "[1, 2, 4, 8]",
    min_round_s: float = 2.0,
    level_s: float = 3.0,
    extra: str = "",
) -> Path:
    path = root / "calibrate.toml"
    path.write_text(
        f'[target]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "{MODEL_NAME}"\n'
        f"timeout_s = 60\n\n"
        f'[prompt]\ntext = "{prompt}"\nmax_tokens = {max_tokens}\n\n'
        f"[ladder]\nbatch_sizes = {batch_sizes}\nrounds = 2\nlatency_rise = 100.0\n"
        f"min_round_s = {min_round_s:g}\n\n"
        f"[sweep]\nconcurrency = [1, 2, 4, 8, 16]\nlevel_s = {level_s:g}\nrepeats = 2\n\n"
        f'[server]\nkind = "llamacpp"\nmodel_path = "{GGUF}"\nport = {port}\n'
        f"ready_timeout_s = 60\nstop_timeout_s = 10\n{extra}",
        encoding="utf-8",
    )
    return path


@pytest.fixture
def llama(isolated: Path) -> Iterator[str]:
    """calibrate.toml for a managed llama-server on a free port; whatever runs is stopped after."""
    port = free_port()
    write_llamacpp_config(isolated, port)
    yield f"http://127.0.0.1:{port}"
    record = process.load(isolated / "runs")
    if record is not None and process.liveness(record) == "running":
        assert main(["server", "stop"]) == 0, "the managed llama-server did not stop"


def metric(root: str, name: str) -> float | None:
    """One gauge from llama.cpp's /metrics (the server runs with --metrics)."""
    text = requests.get(f"{root}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.05)
