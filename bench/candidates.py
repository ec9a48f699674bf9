"""The candidates of bench/transports.py, one request function each, run in a child process:
``python bench/candidates.py CANDIDATE URL N C STREAM`` prints wall seconds, CPU seconds (the
requests only: imports, loop and client set-up excluded) and failures as JSON.

- ``calibrate`` — the same threads and client as it is now (the asyncio transport,
  calibrate/http/aio: one loop thread does every thread's I/O);
- ``calibrate closed loop`` — the sweep's own load engine, ``Sender.closed_loop`` (c in flight,
  each answer's successor sent from the I/O loop, calibrate/load/pacing.py Closed), n requests,
  answers parsed into items with their stream timing as a sweep records them;
- ``calibrate wave`` — the ladder's, ``Sender.send``: the n requests as waves of c, each
  released together and answered before the next (calibrate/load/pacing.py Wave);
- ``aiohttp+uvloop`` / ``aiohttp`` — the reference's client; streams by ``async for line``;
- ``raw-asyncio+uvloop`` / ``raw-asyncio`` — the hand-written client of aio_http.py, coroutines
  on the loop itself (no threads): what an engine written for the loop would cost;
- ``threads→raw-asyncio+uvloop`` — c threads handing requests to one loop thread that runs
  aio_http.py (run_coroutine_threadsafe).

Async candidates parse each event as calibrate does (json.loads, the delta's text kept, a clock
read per text chunk), so the streamed figures compare transports, not parsers.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

MODEL = "internlm-s2"
TOKENS = 64
FD_SPARE = 64  # descriptors beyond one per connection (the mock's stats, pipes, imports)


def _body(i: int, stream: bool) -> bytes:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"summarise item {i}"}],
        "max_tokens": TOKENS,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


# -- the children: one request function per candidate ------------------------------------


def child_threads(url: str, n: int, c: int, stream: bool) -> tuple[float, int]:
    import itertools
    import threading

    from calibrate.errors import RequestError
    from calibrate.http.client import OpenAIClient
    from calibrate.http.models import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, top_p=1.0, seed=0)
    client = OpenAIClient(url, timeout_s=120.0, max_connections=c)
    counter = itertools.count()
    failed = [0]

    def work() -> None:
        while (i := next(counter)) < n:
            body = client.chat_body(MODEL, f"summarise item {i}", params, stream=stream)
            try:
                client.post_completion("/chat/completions", body)
            except RequestError:
                failed[0] += 1

    threads = [threading.Thread(target=work, daemon=True) for _ in range(c)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - t0, failed[0]


def child_closed_loop(url: str, n: int, c: int, stream: bool) -> tuple[float, int]:
    import itertools

    from calibrate.http.client import OpenAIClient
    from calibrate.http.models import SamplingParams
    from calibrate.load.request import Request
    from calibrate.load.sender import Sender
    from calibrate.load.window import LevelWindow

    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, top_p=1.0, seed=0)
    client = OpenAIClient(url, timeout_s=120.0, max_connections=c)
    numbers = itertools.count(1)

    def supply() -> Request:
        i = next(numbers)
        body = client.chat_body(MODEL, f"summarise item {i}", params, stream=stream)
        return Request("/chat/completions", body, (f"summarise item {i}",), i)

    t0 = time.perf_counter()
    run = Sender.over(client).closed_loop(supply, c, LevelWindow(0.0, n), TOKENS)
    wall = time.perf_counter() - t0
    return wall, sum(1 for item in run.items if not item.ok)


def child_wave(url: str, n: int, c: int, stream: bool) -> tuple[float, int]:
    from calibrate.http.client import OpenAIClient
    from calibrate.http.models import SamplingParams
    from calibrate.load.request import Request
    from calibrate.load.sender import Sender

    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, top_p=1.0, seed=0)
    client = OpenAIClient(url, timeout_s=120.0, max_connections=c)
    sender = Sender.over(client)

    def request(i: int) -> Request:
        body = client.chat_body(MODEL, f"summarise item {i}", params, stream=stream)
        return Request("/chat/completions", body, (f"summarise item {i}",), i)

    failed = 0
    t0 = time.perf_counter()
    for first in range(1, n + 1, c):
        wave = [request(i) for i in range(first, min(first + c, n + 1))]
        items, _ = sender.send(wave, len(wave), TOKENS)
        failed += sum(1 for item in items if not item.ok)
    return time.perf_counter() - t0, failed


def child_bridge(url: str, n: int, c: int, stream: bool) -> tuple[float, int]:
    """c threads (today's engine shape) handing each request to one event-loop thread that runs
    the raw client: what the raw transport behind calibrate's synchronous seam would cost."""
    import asyncio
    import itertools
    import threading

    import uvloop
    from aio_http import AioClient, HttpError

    loop = uvloop.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    client = AioClient(url)
    counter = itertools.count()
    failed = [0]

    def work() -> None:
        while (i := next(counter)) < n:
            raw: list[bytes] = []
            stamps: list[float] = []

            def collect(event: bytes, raw: list[bytes] = raw, stamps: list[float] = stamps) -> None:
                raw.append(event)  # on the loop thread: kept with its arrival time, parsed below
                stamps.append(time.perf_counter())

            call = client.request(
                "POST",
                "/chat/completions",
                _body(i, stream),
                timeout_s=120.0,
                on_event=collect if stream else None,
            )
            try:
                answer = asyncio.run_coroutine_threadsafe(call, loop).result()
            except HttpError:
                failed[0] += 1
                continue
            texts: list[str] = []
            if answer.status != 200:
                failed[0] += 1
            elif stream:
                on_event = _events(texts, [])
                for event in raw:
                    on_event(event)
            else:
                texts.append(json.loads(answer.body)["choices"][0]["message"]["content"])

    threads = [threading.Thread(target=work, daemon=True) for _ in range(c)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t0
    loop.call_soon_threadsafe(loop.stop)
    return wall, failed[0]


def _events(texts: list[str], stamps: list[float]):  # type: ignore[no-untyped-def]
    """The per-event work every async candidate does: JSON, the delta's text, a clock read."""

    def on_event(raw: bytes) -> None:
        if raw == b"[DONE]":
            return
        payload = json.loads(raw)
        for choice in payload.get("choices") or ():
            text = (choice.get("delta") or {}).get("content")
            if text:
                texts.append(text)
                stamps.append(time.perf_counter())

    return on_event


async def child_aiohttp(url: str, n: int, c: int, stream: bool) -> tuple[float, int]:
    import itertools

    import aiohttp

    counter = itertools.count()
    failed = 0
    timeout = aiohttp.ClientTimeout(total=120.0)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=c), timeout=timeout
    ) as session:

        async def work() -> None:
            nonlocal failed
            while (i := next(counter)) < n:
                texts: list[str] = []
                on_event = _events(texts, [])
                try:
                    async with session.post(
                        url + "/chat/completions", data=_body(i, stream), headers=headers
                    ) as r:
                        if r.status != 200:
                            failed += 1
                            await r.read()
                        elif stream:
                            async for line in r.content:
                                if line.startswith(b"data:"):
                                    on_event(line[5:].strip())
                        else:
                            d = json.loads(await r.read())
                            texts.append(d["choices"][0]["message"]["content"])
                except (aiohttp.ClientError, TimeoutError):
                    failed += 1

        import asyncio

        t0 = time.perf_counter()
        await asyncio.gather(*(work() for _ in range(c)))
        return time.perf_counter() - t0, failed


async def child_raw(url: str, n: int, c: int, stream: bool) -> tuple[float, int]:
    import asyncio
    import itertools

    from aio_http import AioClient, HttpError

    client = AioClient(url)
    counter = itertools.count()
    failed = 0

    async def work() -> None:
        nonlocal failed
        while (i := next(counter)) < n:
            texts: list[str] = []
            on_event = _events(texts, []) if stream else None
            try:
                answer = await client.request(
                    "POST",
                    "/chat/completions",
                    _body(i, stream),
                    timeout_s=120.0,
                    on_event=on_event,
                )
            except HttpError:
                failed += 1
                continue
            if answer.status != 200:
                failed += 1
            elif not stream:
                d = json.loads(answer.body)
                texts.append(d["choices"][0]["message"]["content"])

    t0 = time.perf_counter()
    await asyncio.gather(*(work() for _ in range(c)))
    wall = time.perf_counter() - t0
    client.close()
    return wall, failed


def child_main(candidate: str, url: str, n: int, c: int, stream: bool) -> None:
    """In the child: run the candidate; print wall seconds, CPU seconds and failures as JSON."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < c + FD_SPARE:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, c + 4 * FD_SPARE), hard))
    if candidate == "calibrate":
        import calibrate.http.client

        r0 = resource.getrusage(resource.RUSAGE_SELF)
        wall, failed = child_threads(url, n, c, stream)
    elif candidate in ("calibrate closed loop", "calibrate wave"):
        import calibrate.load.sender  # noqa: F401  (imports are start-up: not measured)

        r0 = resource.getrusage(resource.RUSAGE_SELF)
        child = child_closed_loop if candidate == "calibrate closed loop" else child_wave
        wall, failed = child(url, n, c, stream)
    elif candidate.startswith("threads→"):
        import aio_http
        import uvloop

        r0 = resource.getrusage(resource.RUSAGE_SELF)
        wall, failed = child_bridge(url, n, c, stream)
    else:
        import asyncio

        import aio_http  # noqa: F401
        import aiohttp  # noqa: F401

        factory = None
        if candidate.endswith("+uvloop"):
            import uvloop

            factory = uvloop.new_event_loop
        run = child_aiohttp if candidate.startswith("aiohttp") else child_raw
        with asyncio.Runner(loop_factory=factory) as runner:
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            wall, failed = runner.run(run(url, n, c, stream))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "failed": failed}), flush=True)


# -- the parent: mocks, points, the table ------------------------------------------------


if __name__ == "__main__":
    cand, url, n, c, stream = sys.argv[1:]
    child_main(cand, url, int(n), int(c), stream == "1")
