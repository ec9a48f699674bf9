"""Fakes for the server tests: a managed-mock config, ledger entries, a fake engine on PATH."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from calibrate.state.ledger import LedgerEntry
from tests.helpers import NO_PLOT

REPO = Path(__file__).resolve().parents[2]
FAKE_ENGINE = Path(__file__).with_name("engine.sh")
ENGINE_NAMES = (
    "vllm",
    "llama-server",
    "python3",
    "lmdeploy",
    "text-generation-launcher",
    "ollama",
    "fake-engine",
)


PORT_BAND = 1000  # ports per test worker


def free_port() -> int:
    """A port no other test of this run is handed: in this xdist worker's own band, below the
    kernel's ephemeral range where the port-0 servers of every worker land. A port-0 pick that
    is closed again and bound later by a child process could meanwhile go to another worker's
    mock — a managed server then looked ready on someone else's /health."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    start = 20000 + (int(worker) if worker.isdigit() else 0) * PORT_BAND
    for port in random.sample(range(start, start + PORT_BAND), PORT_BAND):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or still in TIME_WAIT from an earlier test
            return port
    raise RuntimeError(f"no free port in {start}-{start + PORT_BAND - 1}")


def mock_command(*extra: str) -> str:
    """The mock as a managed engine: ``<python> -m calibrate mock --port {port} --slots {concurrency}``."""
    args = [sys.executable, "-m", "calibrate", "mock", "--ttft", "0.002", "--per-token", "0.0005"]
    return shlex.join([*args, *extra]) + " --port {port} --slots {concurrency}"


def managed_config(
    root: Path, port: int, command: str, *, ready_timeout_s: float = 15, extra: str = ""
) -> Path:
    """calibrate.toml with a custom-kind [server] whose target is that server's port."""
    path = root / "calibrate.toml"
    # as write_config: no plot.png unless ``extra`` has a [report]; before [server], whose keys
    # a test may go on appending
    report = "" if "[report]" in extra else NO_PLOT
    path.write_text(
        f'[target]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "internlm-s2"\ntimeout_s = 30\n'
        f'{report}[server]\nkind = "custom"\nport = {port}\ncommand = {json.dumps(command)}\n'
        f"ready_timeout_s = {ready_timeout_s}\nstop_timeout_s = 5\n{extra}",
        encoding="utf-8",
    )
    return path


def append_ledger(
    root: Path,
    stage: str,
    target: str,
    summary: dict[str, Any],
    *,
    passed: bool = True,
    run_id: str | None = None,
) -> None:
    """A stage result written straight into the ledger (instead of running that stage)."""
    entry = LedgerEntry(
        stage, run_id or f"20261129T160000Z-{stage}-abcdef", target, passed, summary
    )
    ledger = root / "runs" / "ledger.jsonl"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with ledger.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry.to_json(), ensure_ascii=False) + "\n")


def passing_ladder(root: Path, target: str, batch_size: int = 4) -> None:
    append_ledger(
        root,
        "ladder",
        target,
        {
            "last_passing": {"batch_size": batch_size, "concurrency": batch_size},
            "stopped_by": "failure",
        },
    )


KNEE_NOT_SURE = "sweep: knee at 2 (+101 % over 1) — not sure"  # the status / pin line of it


def unsure_setting(root: Path, target: str, taken: str) -> None:
    """A ladder whose batch 4 was ``taken`` under noise and a sweep whose knee at 2 was not sure
    (the best was the last level tried), written straight into the ledger."""
    ladder = {"last_passing": {"batch_size": 4, "concurrency": 4}, "setting_reason": taken}
    append_ledger(root, "ladder", target, ladder)
    how = "knee at 2 (+101 % over 1); the best is the last level tried"
    sweep = {
        "recommended_concurrency": 2,
        "batch_size": 4,
        "knee": {"how_sure": how, "sure": False},
    }
    append_ledger(root, "sweep", target, sweep, run_id="20261129T170000Z-sweep-abcdef")


def install_fake_engines(bin_dir: Path) -> Path:
    """Every engine's launcher name, linked to the recording fake, in ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ENGINE_NAMES:
        (bin_dir / name).symlink_to(FAKE_ENGINE)
    return bin_dir


def recorded_run(out: Path) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) the fake engine recorded."""
    argv = out.read_bytes().split(b"\0")[:-1]
    env: dict[str, str] = {}
    for line in out.with_name(out.name + ".env").read_text().splitlines():
        name, _, value = line.partition("=")
        if name.isidentifier():
            env[name] = value
    return [a.decode() for a in argv], env


def pid_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone while it was read (ESRCH)
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def kill_9(pid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL ``pid`` and return once it is gone. A kill is delivered, not done: beside the rest
    of the suite a mock's threads took a second to end, and the command that came next found it
    alive and stopped it itself (a rollback said "SIGTERM" for an engine killed by SIGKILL)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while not pid_gone(pid):
        assert time.monotonic() < deadline, f"PID {pid} outlived kill -9 for {timeout_s:g} s"
        time.sleep(0.02)


def pythonpath_env() -> str:
    return os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
