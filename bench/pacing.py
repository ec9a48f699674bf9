"""Bench row for the open loop's pacing (issue 25): how late sends go out at 1,000 req/s.

The sweep's rate mode sends each request at its scheduled time; its send lag is the actual send
time minus the scheduled one, per request, on the monotonic clock (``load.pacer``). Here the
sweep's engine (``Sender.open_loop``, the pacer and its sender threads, calibrate's HTTP client)
sends RATE req/s for SECONDS on a constant schedule to ``calibrate mock --ttft 0 --per-token 0``
(a separate process), and the row prints p50 / p99 / max send lag, the sends more than 1 ms
late, the achieved rate and the client's CPU per request; a second row runs the pacer and its
sender threads alone, each send answered at once in-process, to tell the pacing from the HTTP. The target is p99 ≤ 1 ms at
1,000 req/s; it reports, it never fails. The load average is printed beside it: on a shared
machine the figure is the machine's as much as the pacer's.

usage: python bench/pacing.py [--rate R] [--seconds S] [--arrival constant|poisson] [--json PATH]
(also ``python bench/bench.py --only pacing``)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from calibrate.http.client import OpenAIClient  # noqa: E402
from calibrate.http.models import Choice, Completion, SamplingParams, Usage  # noqa: E402
from calibrate.load.answers import answer_items  # noqa: E402
from calibrate.load.arrivals import Arrival, arrival_times  # noqa: E402
from calibrate.load.items import ItemResult  # noqa: E402
from calibrate.load.open_loop import OpenRun, judge, open_loop  # noqa: E402
from calibrate.load.pacer import LATE_S  # noqa: E402
from calibrate.load.request import Request, build_requests  # noqa: E402
from calibrate.load.waves import Sender  # noqa: E402
from tests.mockserver import start_mock_process  # noqa: E402

MODEL = "internlm-s2"
PARAMS = SamplingParams(temperature=0.0, max_tokens=256, top_p=1.0, seed=0)


def measure(
    rate: float = 1000.0, seconds: float = 5.0, arrival: Arrival = "constant"
) -> dict[str, Any]:
    """Both rows: the engine on the zero-latency mock, and the pacer alone (no HTTP)."""
    return {
        "mock": measure_mock(rate, seconds, arrival),
        "alone": measure_alone(rate, seconds, arrival),
    }


def measure_mock(rate: float, seconds: float, arrival: Arrival) -> dict[str, Any]:
    """One open-loop run of ``rate × seconds`` requests on a zero-latency mock: its send lag."""
    count = round(rate * seconds)
    with start_mock_process("--ttft", "0", "--per-token", "0") as mock:
        client = OpenAIClient(mock.base_url, timeout_s=60, max_connections=256)
        prompts = [[f"pacing {n}"] for n in range(count)]
        requests = build_requests(client, MODEL, PARAMS, prompts, "wave")
        schedule = arrival_times(rate, count, arrival=arrival, seed=1)
        sender = Sender(client)
        sender.open_loop(requests[:50], schedule[:50], None, PARAMS.max_tokens)  # warm up
        load = os.getloadavg()[0]
        cpu0 = time.process_time()
        run = sender.open_loop(requests, schedule, None, PARAMS.max_tokens)
        cpu_s = time.process_time() - cpu0
        client.close()
    return _row(
        "calibrate's client on the zero-latency mock", rate, seconds, arrival, run, cpu_s, load
    )


def measure_alone(rate: float, seconds: float, arrival: Arrival) -> dict[str, Any]:
    """The pacer and its sender threads with no HTTP at all: each send answers at once."""
    count = round(rate * seconds)
    schedule = arrival_times(rate, count, arrival=arrival, seed=1)
    answer = Completion((Choice(0, "t", "stop"),), Usage(1, 1, 2), MODEL, None, 0.0)
    request = Request("/chat/completions", {}, ("p",), 1)

    def send_one(n: int, t0: float) -> list[ItemResult]:
        return [replace(i, index=n + 1) for i in answer_items(request, answer, 0.0, 0.0, None)]

    load = os.getloadavg()[0]
    cpu0 = time.process_time()
    run = open_loop(send_one, schedule, None)
    cpu_s = time.process_time() - cpu0
    return _row("the pacer alone, no HTTP", rate, seconds, arrival, run, cpu_s, load)


def _row(
    what: str, rate: float, seconds: float, arrival: str, run: OpenRun, cpu_s: float, load: float
) -> dict[str, Any]:
    verdict = judge(run, rate, None)
    lag = verdict.send_lag
    return {
        "what": what,
        "rate": rate,
        "seconds": seconds,
        "arrival": arrival,
        "sent": len(run.lag_s),
        "failed": sum(not i.ok for i in run.items),
        "send_lag_p50_ms": lag.p50_s * 1e3 if lag else None,
        "send_lag_p99_ms": lag.p99_s * 1e3 if lag else None,
        "send_lag_max_ms": lag.max_s * 1e3 if lag else None,
        "late_sends": lag.late if lag else None,
        "achieved_rate": verdict.achieved_rate,
        "max_in_flight": max(run.in_flight, default=0) + 1,
        "cpu_ms_per_request": cpu_s / max(1, len(run.lag_s)) * 1e3,
        "load_average": load,
        "cpus": os.cpu_count(),
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The rows as the bench prints them."""
    return "\n".join(_line(row) for row in rows.values())


def _line(row: dict[str, Any]) -> str:
    if row["send_lag_p99_ms"] is None:
        return f"pacing, {row['what']}: nothing was sent ({row['failed']} failed)"
    verdict = "meets" if row["send_lag_p99_ms"] <= 1.0 else "misses"
    return (
        f"pacing at {row['rate']:g} req/s × {row['seconds']:g} s ({row['arrival']}), {row['what']}: "
        f"send lag p50 {row['send_lag_p50_ms']:.3f} / p99 {row['send_lag_p99_ms']:.3f} / max "
        f"{row['send_lag_max_ms']:.3f} ms ({verdict} p99 ≤ 1 ms); {row['late_sends']} of "
        f"{row['sent']} sends over {LATE_S * 1e3:g} ms late; achieved {row['achieved_rate']:.0f} "
        f"req/s, {row['failed']} failed, at most {row['max_in_flight']} in flight; CPU "
        f"{row['cpu_ms_per_request']:.3f} ms/request; load average {row['load_average']:.1f} on "
        f"{row['cpus']} CPUs"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="requests/s (default 1000)")
    parser.add_argument("--seconds", type=float, default=5.0, help="run length (default 5)")
    parser.add_argument("--arrival", choices=("constant", "poisson"), default="constant")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args()
    rows = measure(args.rate, args.seconds, args.arrival)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
