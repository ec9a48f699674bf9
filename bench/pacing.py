"""Bench section ``pacing`` (issue 25, item 4): how late an open loop's sends go out.

An open loop (``sweep --rates``, ``--auto``, ``--find-max --rates``) promises each request at its
scheduled time; a send that goes out late offers the server less than the rate it says. Each point
runs ``Sender.open_loop`` in a child process of its own against a fast mock (answers in 10 ms,
16 tokens) at a constant rate for ``--seconds``, and reports how late each request started
against its schedule (p50, p99, max, in ms) — over the asyncio transport (each request handed to
the I/O loop at its time; the urllib3 path, a thread started per send, is gone). Target: p99 ≤ 1 ms
at 1,000 req/s.

usage: python bench/pacing.py [--rates 200,1000,2000] [--seconds S] [--reference-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

RATES = (200, 1000, 2000)
TRANSPORTS = ("asyncio",)  # the one transport for completions


@dataclass(frozen=True)
class Point:
    transport: str
    rate: float
    requests: int
    ok: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float


def child(url: str, model: str, rate: float, seconds: float) -> Point:
    """One open loop at ``rate`` over the one transport for completions (asyncio)."""
    from calibrate.http.client import OpenAIClient
    from calibrate.load.request import Request
    from calibrate.load.sender import Sender

    client = OpenAIClient(url, timeout_s=30, max_connections=256)
    n = int(rate * seconds)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 256}
    requests = [Request("/chat/completions", body, ("hi",), i) for i in range(n)]
    schedule = [i / rate for i in range(n)]
    run = Sender.over(client).open_loop(requests, schedule, None, 256)
    client.close()
    lags = sorted(max(0.0, item.started_s - schedule[item.index]) for item in run.items)

    def at(q: float) -> float:
        return lags[min(len(lags) - 1, int(q * len(lags)))] * 1000 if lags else 0.0

    transport = "asyncio"
    ok = sum(1 for item in run.items if item.ok)
    return Point(transport, rate, n, ok, at(0.5), at(0.99), lags[-1] * 1000 if lags else 0.0)


def measure(url: str, model: str, rates: tuple[float, ...], seconds: float) -> list[Point]:
    points = []
    for rate in rates:
        for _transport in TRANSPORTS:  # one transport now: one point per rate
            env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
            env.update(PYTHONPATH=str(REPO))
            args = [sys.executable, __file__, "--child", url, model, str(rate), str(seconds)]
            done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
            points.append(Point(**json.loads(done.stdout)))
    return points


def table(points: list[Point], seconds: float) -> str:
    lines = [
        f"open-loop send lag against the schedule, constant rate, {seconds:g} s a point "
        "(target: p99 ≤ 1 ms at 1,000 req/s)",
        "",
        "| transport | rate req/s | requests (ok) | lag p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.transport} | {p.rate:g} | {p.requests} ({p.ok}) | {p.lag_p50_ms:.2f} "
            f"| {p.lag_p99_ms:.2f} | {p.lag_max_ms:.1f} |"
        )
    return "\n".join(lines)


def fast_mock(reference_dir: Path | None) -> tuple[subprocess.Popen[bytes], str, str]:
    """The shared async mock when it is there (10 ms answers), else calibrate's own."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = (reference_dir or REPO.parent / "shared" / "bench") / "async_mock.py"
    if script.exists():
        args = [sys.executable, str(script), "--port", str(port), "--delay", "0.01"]
        model = "mock-model"
    else:
        args = [sys.executable, "-m", "calibrate", "mock", "--port", str(port)]
        args += ["--ttft", "0.01", "--per-token", "0"]
        model = "internlm-s2"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    return proc, url + "/v1", model


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        url, model, rate, seconds = sys.argv[2:6]
        print(json.dumps(asdict(child(url, model, float(rate), float(seconds)))))
        return 0
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default=",".join(map(str, RATES)))
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--reference-dir", type=Path)
    args = parser.parse_args()
    rates = tuple(float(r) for r in args.rates.split(","))
    proc, url, model = fast_mock(args.reference_dir)
    try:
        print(table(measure(url, model, rates, args.seconds), args.seconds))
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
