"""Helpers of the vLLM suite: its model, prompts, a `vllm serve` the test starts itself (as a user
would, unmanaged), the config calibrate reads, and the server's own /metrics."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
# Head size 32 (scripts/build_tiny_model.py --head-dim 32): vLLM's CPU attention refuses 16.
MODEL_DIR = REPO / "tests/engine/model-vllm"
MODEL_NAME = "tiny-vllm"  # --served-model-name: the name clients send
PROMPT = "What is 2 plus 3?"
LONG_PROMPT = "Count to 100."  # about 200 tokens of answer
MAX_MODEL_LEN = 512  # the model's positions
READY_S = 420.0  # start to ready is 50-90 s on an idle 2-core machine; a busy one takes longer
# vLLM's CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB); 1 GiB is 2 M tokens of
# the tiny model, and keeps each server's RSS near 3 GB on a shared machine.
KV_SPACE_GIB = "1"
# The suite's stages are about the engine (its cap, queue, preemptions, fingerprint, restarts),
# not about telling settings apart on a 2-core machine the CPU build itself keeps busy: a verdict
# noise leaves in doubt is taken conservatively (SPEC §5.14), said and recorded.
CONSERVATIVE = "[confidence]\nconservative = true\n"


def show(text: str) -> None:
    """For the CI log (with -s): past capsys, which the next in-process command would swallow."""
    sys.__stdout__.write(text + "\n")
    sys.__stdout__.flush()


def sweep_done(result: Any) -> bool:
    """A sweep that ran to its end: passed, or inconclusive because calibrate's own self-check
    found the client the limit — an honest verdict on a shared 2-core machine at load 8-10
    (SPEC §5.6), which recommends nothing. Any other exit is a failure."""
    if result.code == 1 and "inconclusive: the client was the limit" in result.err:
        show("(the sweep was inconclusive: the client was the limit on this busy machine)")
        return True
    return bool(result.code == 0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_token(root: str, model: str = MODEL_NAME) -> bool:
    """Whether the server answers a real 1-token completion (ready means that, not /health)."""
    try:
        answer = requests.post(
            f"{root}/v1/completions",
            json={"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0},
            timeout=30,
        )
    except requests.RequestException:
        return False
    return answer.status_code == 200


@dataclass(frozen=True)
class Served:
    """A running `vllm serve` the test started: where, how, and how long it took to be ready."""

    root: str  # http://127.0.0.1:PORT
    port: int
    argv: tuple[str, ...]
    log: Path
    ready_s: float


@contextmanager
def vllm_serve(vllm: Path, log: Path, flags: Sequence[str]) -> Iterator[Served]:
    """``vllm serve`` the tiny model on a free port with ``flags``, in its own session; waits for
    a 1-token completion, yields, then stops its process group by PID (SIGTERM, then SIGKILL)."""
    port = free_port()
    argv = (
        str(vllm),
        "serve",
        str(MODEL_DIR),
        "--served-model-name",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        *flags,
    )
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": KV_SPACE_GIB}
    out = log.open("wb")
    started = time.monotonic()
    server = subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    root = f"http://127.0.0.1:{port}"
    try:
        while not one_token(root):
            if server.poll() is not None:
                tail = log.read_text("utf-8", errors="replace").splitlines()[-30:]
                pytest.fail(f"vllm serve exited {server.returncode}:\n" + "\n".join(tail))
            if time.monotonic() - started > READY_S:
                pytest.fail(f"vllm serve answered no completion within {READY_S:g} s; see {log}")
            time.sleep(1)
        ready_s = time.monotonic() - started
        show(f"\nvllm serve {' '.join(flags)}: ready (a 1-token completion) after {ready_s:.0f} s")
        yield Served(root, port, argv, log, ready_s)
    finally:
        _stop(server)
        out.close()


def _stop(server: subprocess.Popen[bytes]) -> None:
    with_group = True
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        with_group = False
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        if with_group:
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)


def metrics_text(root: str) -> str:
    return requests.get(f"{root}/metrics", timeout=10).text


def metric(text: str, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s series in Prometheus text whose labels include ``labels``."""
    found: float | None = None
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            found = (found or 0.0) + float(value)
    return found


def metric_names(text: str) -> set[str]:
    """Every series name in Prometheus text (``name{…} value`` and ``name value`` lines)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    return names


class QueueWatch:
    """The server's own account while a stage runs: the most requests vLLM ran at once
    (``vllm:num_requests_running``) and the most it held waiting, polled every few ms."""

    def __init__(self, root: str) -> None:
        self.root, self.running_max, self.waiting_max = root, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                text = metrics_text(self.root)
            except requests.RequestException:
                continue
            self.running_max = max(self.running_max, metric(text, "vllm:num_requests_running") or 0)
            self.waiting_max = max(self.waiting_max, metric(text, "vllm:num_requests_waiting") or 0)
            time.sleep(0.01)

    def __enter__(self) -> QueueWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def write_config(
    root: Path,
    port: int,
    *,
    prompt: str = PROMPT,
    max_tokens: int = 32,
    batch_sizes: str = "[1, 2, 4, 8]",
    concurrency: str = "[1, 2, 4, 8]",
    ladder_extra: str = "",
    server: str = "",
) -> Path:
    """calibrate.toml for the server on ``port``: short rounds and levels (each vLLM start costs
    a minute; the measuring does not need to), and ``server`` as the [server] section's body."""
    path = root / "calibrate.toml"
    text = (
        f'[target]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "{MODEL_NAME}"\n'
        f"timeout_s = 60\n\n"
        f'[prompt]\ntext = "{prompt}"\nmax_tokens = {max_tokens}\n\n'
        f"[ladder]\nbatch_sizes = {batch_sizes}\nrounds = 2\nmin_round_s = 1\n{ladder_extra}\n"
        f"[sweep]\nconcurrency = {concurrency}\nlevel_s = 2\nrepeats = 2\n\n{CONSERVATIVE}"
    )
    if server:
        text += f"\n[server]\n{server}"
    path.write_text(text, encoding="utf-8")
    return path
