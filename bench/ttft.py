"""How true is the TTFT calibrate records under a burst? Its wave against an aiohttp+uvloop
client, on one mock, in one run.

A ladder's wave of B streamed requests goes out at once; each request's TTFT is the time from
its send to the first text chunk's bytes. Part of what is recorded is the mock's own delay in
serving B streams at once on a machine it shares, part could be calibrate's (a loop busy
parsing while another stream's first chunk waits). Measured side by side — the same B, the
same mock (the shared reference's ``async_mock.py``: 64 chunks over D seconds, so its own
first token is at D / 64) — calibrate's figure should be no higher than the reference's: any
excess is the client's. Waves alternate between the two clients, ``--waves`` of each.

usage: python bench/ttft.py [--batch 32,128] [--delay D] [--waves K] [--reference-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import reference  # noqa: E402  (bench/ is this script's folder)

MODEL = reference.MODEL
CHUNKS = 64


@dataclass(frozen=True)
class Point:
    client: str
    batch: int
    server_ttft_ms: float  # the mock's own first chunk: D / 64
    p50_ms: float
    p90_ms: float
    max_ms: float


def _body() -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "summarise"}],
        "max_tokens": CHUNKS,
        "stream": True,
    }


async def _reference_wave(url: str, batch: int) -> list[float]:
    import aiohttp

    async def one(session: aiohttp.ClientSession) -> float:
        t0 = time.perf_counter()
        async with session.post(url + "/chat/completions", json=_body()) as response:
            first = None
            async for line in response.content:
                if first is None and line.startswith(b"data: {"):
                    first = time.perf_counter() - t0
            return first if first is not None else float("nan")

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        return list(await asyncio.gather(*(one(session) for _ in range(batch))))


def _calibrate_wave(sender: object, batch: int) -> list[float]:
    from calibrate.load.request import Request

    requests = [Request("/chat/completions", _body(), ("summarise",), n) for n in range(batch)]
    items, _ = sender.send(requests, batch)  # type: ignore[attr-defined]
    return [i.ttft_s for i in items if i.ttft_s is not None]


def _point(client: str, batch: int, delay_s: float, ttfts: list[float]) -> Point:
    ms = sorted(t * 1000 for t in ttfts)
    return Point(
        client,
        batch,
        delay_s / CHUNKS * 1000,
        statistics.median(ms),
        ms[int(len(ms) * 0.9)],
        ms[-1],
    )


def measure(url: str, batches: list[int], delay_s: float, waves: int) -> list[Point]:
    import uvloop

    from calibrate.http.client import OpenAIClient
    from calibrate.load.sender import Sender

    client = OpenAIClient(url, timeout_s=120.0, max_connections=max(batches))
    sender = Sender.over(client)
    _calibrate_wave(sender, 8)  # connections opened, imports done
    points: list[Point] = []
    for batch in batches:
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(waves):
            theirs += uvloop.run(_reference_wave(url, batch))
            ours += _calibrate_wave(sender, batch)
        points.append(_point("aiohttp+uvloop", batch, delay_s, theirs))
        points.append(_point("calibrate wave", batch, delay_s, ours))
    client.close()
    return points


def table(points: list[Point]) -> str:
    lines = [
        "| client | B | the mock's own TTFT | recorded p50 | p90 | max |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.client} | {p.batch} | {p.server_ttft_ms:.1f} ms | {p.p50_ms:.1f} ms | "
            f"{p.p90_ms:.1f} ms | {p.max_ms:.1f} ms |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="32,128", help="wave sizes (32,128)")
    parser.add_argument("--delay", type=float, default=1.0, help="the mock's D in seconds (1.0)")
    parser.add_argument("--waves", type=int, default=3, help="waves of each client per B (3)")
    parser.add_argument("--reference-dir", help="the shared reference (../shared/bench)")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batch.split(",") if b.strip()]
    setup = reference.find_setup(args.reference_dir, None)
    if setup.mock_script is None or setup.skipped_why:
        print(f"skipped: needs async_mock.py and aiohttp+uvloop ({setup.skipped_why or 'no mock'})")
        return 0
    extra = ("--tokens", str(CHUNKS), "--chunks", str(CHUNKS))
    with reference.mock_at(setup, args.delay, extra) as url:
        print(table(measure(url, batches, args.delay, args.waves)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
