"""Helpers of the llama.cpp suite: its model, prompts, a free port, the config it writes, and
waiting on the server's /metrics."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
GGUF = REPO / "tests/engine/model.gguf"
MODEL_NAME = "tiny-llama"  # llama.cpp serves it under the --alias calibrate passes
PROMPT = "What is 2 plus 3?"
LONG_PROMPT = "Count to 100."  # about 100 tokens of answer: enough work for a real knee
# The suite's stages are about the engine (its cap, queue, threads, restarts), not about telling
# settings apart on a shared 2-core machine: a verdict noise leaves in doubt is taken
# conservatively (SPEC §5.14), said and recorded; bench/knee_noise.py measures the rule itself.
CONSERVATIVE = "[confidence]\nconservative = true\n"


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
        CONSERVATIVE
        + f'[target]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "{MODEL_NAME}"\n'
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
