"""What calibrate's watching of itself and the machine costs in CPU (SPEC §5.14).

    python bench/selfwatch.py [--sockets 5000] [--reps 15] [--rounds 3] [--code DIR …]

A "server" child process listens on a port of 127.0.0.1; ``--sockets`` TCP connections to
another local listener are held open (each one two lines of ``/proc/net/tcp``, as on a busy
inference box or under a test suite). Then, in a fresh process per code and round (several
``--code DIR`` interleave, e.g. an older commit ``git archive``d next to this checkout), CPU
milliseconds (user + system: the kernel writing /proc is the reader's system time) per call:

- ``lookup``: who listens on the port, once, from cold (``LinuxProc().listening``);
- ``again``: the same reader asked again (what a stage's windows pay after the first);
- ``listener_pid``: the one-shot lookup ``rollback`` prints a stop command from;
- ``server_cpu``: one self-check window's reading of the server's CPU (its process tree);
- ``noise``: one noise-meter sample (a mark and what the machine did since).

The median of ``--reps`` calls per round; the medians of the rounds are printed per code, and
each code's ratio to the first one. Ratios, not absolute times: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SERVER = (
    "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "print(s.getsockname()[1], flush=True); sys.stdin.read()"
)
FIGURES = ("lookup", "again", "listener_pid", "server_cpu", "noise")


def cpu_ms(call: Callable[[], object], reps: int) -> float:
    """The median CPU milliseconds of ``call`` over ``reps`` calls."""
    took: list[float] = []
    for _ in range(reps):
        start = time.process_time()
        call()
        took.append((time.process_time() - start) * 1000)
    return statistics.median(took)


def child(port: int, server_pid: int, reps: int) -> dict[str, float]:
    """One code's figures, run in a process whose ``sys.path`` starts with that code."""
    from calibrate.gpu.noise import LinuxProc, NoiseMeter, server_cpu
    from calibrate.server.pids import listener_pid

    assert LinuxProc().listening(port) == [server_pid], "the server was not found"
    warm = LinuxProc()
    warm.listening(port)
    reading = server_cpu(LinuxProc(), lambda: [server_pid])
    meter = NoiseMeter(LinuxProc())
    return {
        "lookup": cpu_ms(lambda: LinuxProc().listening(port), reps),
        "again": cpu_ms(lambda: warm.listening(port), reps),
        "listener_pid": cpu_ms(lambda: listener_pid(port), reps),
        "server_cpu": cpu_ms(reading, reps),
        "noise": cpu_ms(lambda: meter.since(meter.mark()), reps),
    }


def hold_sockets(count: int) -> list[socket.socket]:
    """``count`` open connections to a listener of this process (both ends kept)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 2 * count + 256)), hard))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    held = [listener]
    for _ in range(count):
        held.append(socket.create_connection(listener.getsockname()))
        held.append(listener.accept()[0])
    return held


def run_code(code: Path, port: int, server_pid: int, reps: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    argv = [sys.executable, __file__, "--child", str(port), str(server_pid), str(reps)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        port, server_pid, reps = (int(v) for v in sys.argv[2:5])
        print(json.dumps(child(port, server_pid, reps)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--sockets", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--code", type=Path, action="append", help="default: this checkout")
    args = parser.parse_args()
    codes: list[Path] = args.code or [REPO]
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None and server.stdin is not None
    port = int(server.stdout.readline())
    held = hold_sockets(args.sockets)
    rows: dict[Path, list[dict[str, float]]] = {code: [] for code in codes}
    try:
        for _ in range(args.rounds):
            for code in codes:
                rows[code].append(run_code(code, port, server.pid, args.reps))
    finally:
        for s in held:
            s.close()
        server.stdin.close()
        server.wait()
    processes = sum(1 for name in os.listdir("/proc") if name.isdigit())
    print(f"{args.sockets} connections held, {processes} processes; CPU ms per call")
    first: dict[str, Any] = {}
    for code, found in rows.items():
        figures = {k: statistics.median(r[k] for r in found) for k in FIGURES}
        first = first or figures
        cells = "  ".join(
            f"{k} {figures[k]:7.3f}"
            + (f" ({figures[k] / first[k]:.2f}x)" if code != codes[0] and first[k] else "")
            for k in FIGURES
        )
        print(f"{code}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
