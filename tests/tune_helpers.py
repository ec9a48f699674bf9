"""The mock as a managed custom engine whose {placeholders} are tune's axes."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from calibrate import config
from calibrate.state.ledger import target_fingerprint
from tests.fakes import free_port, managed_config, passing_ladder

MOCK = [sys.executable, "-m", "calibrate", "mock", "--ttft", "0.002", "--per-token", "0.0005"]
# {slots} decode at once; {kv_tokens} of KV cache; a start above --max-memory-fraction 0.8 dies
# like an engine whose cache does not fit (exit 1, CUDA out of memory).
FLAGS = (
    " --port {port} --slots {slots} --kv-capacity-tokens {kv_tokens}"
    " --step-ms-per-1k-tokens 0.5 --memory-fraction {memory_fraction} --max-memory-fraction 0.8"
)
COMMAND = shlex.join(MOCK) + FLAGS  # ~25 ms answers: the level windows stay short
# ~100 ms answers: four slots serve ~40 req/s, where the server and not this shared machine's
# CPU sets the pace, so candidates' throughputs keep their slots' ratios (a ranking test)
SERVER_BOUND = shlex.join([*MOCK[:-1], "0.002"]) + FLAGS
LEVELS = "[sweep]\nconcurrency = [1, 2, 4]\nlevel_s = 0.1\nrepeats = 1\n[ladder]\nsample_interval_s = 0.02\nmin_round_s = 0\n"


def tune_config(
    root: Path,
    tune: str,
    *,
    command: str = COMMAND,
    batch: int = 4,
    levels: str = LEVELS,
    search: str | None = "grid",
) -> str:
    """calibrate.toml with the mock as [server] and a passing ladder at ``batch``; the target.
    ``search`` is [tune] search: the grid by default here, where a test counts every candidate
    of its grid (None: the product's default, refine)."""
    port = free_port()
    chosen = f'search = "{search}"\n' if search else ""
    managed_config(root, port, command, extra=levels + "[tune]\n" + chosen + tune)
    cfg = config.load(config.Overrides(config_path=str(root / "calibrate.toml")), {})
    target = target_fingerprint(cfg)
    passing_ladder(root, target, batch)
    return target


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text("utf-8").splitlines() if x.strip()]
