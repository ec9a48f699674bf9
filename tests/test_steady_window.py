"""A closed loop's throughput counts each answer once, whatever order calibrate handles them in.

A server that runs C requests together ends them together. calibrate handles those answers one
after another; the first handled once the window is done is not replaced, and the steady window
used to close when calibrate decided that, on its own clock, after the rest of the burst had
finished: up to C − 1 answers counted too many. In a short window (tune's, or a sweep's small
levels) that read 9.6 items/s at concurrency 2 on a server that can do 8.2.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

import pytest

from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.load.waves import Sender
from calibrate.load.window import LevelWindow, LoopRun, steady_throughput
from tests.mockserver import start_mock

PARAMS = SamplingParams(temperature=0.0, max_tokens=512, top_p=1.0, seed=0)


def _supply(client: OpenAIClient) -> Callable[[], Request]:
    numbers = itertools.count(1)

    def supply() -> Request:  # one prompt: every answer is as long, so a burst ends together
        body = client.chat_body("internlm-s2", "the same item", PARAMS)
        return Request("/chat/completions", body, ("the same item",), next(numbers))

    return supply


@pytest.mark.parametrize("io", ["asyncio", "urllib3"])
@pytest.mark.parametrize("concurrency", [2, 4])
def test_a_closed_loop_is_never_faster_than_a_server_that_ends_its_batch_together(
    io: str, concurrency: int
) -> None:
    # C slots, a fixed ≈ 0.1 s per request: the server's most is C / 0.1 s, and every burst of
    # C answers ends within a millisecond or so
    with start_mock(slots=concurrency, ttft_s=0.02, per_token_s=0.002) as mock:
        client = OpenAIClient(mock.base_url, io=io)  # type: ignore[arg-type]
        try:
            sender = Sender(client)
            for _ in range(3):
                run = sender.closed_loop(
                    _supply(client), concurrency, LevelWindow(0.0, 4 * concurrency)
                )
                latency_s = statistics.median(i.elapsed_s for i in run.items if i.ok)
                steady = steady_throughput(run)
                assert not steady.whole_run
                ceiling = concurrency / latency_s
                assert steady.items_per_s <= ceiling * 1.04, (
                    f"{steady.items_per_s:.2f} items/s from {steady.completions} answers in "
                    f"{steady.window_s:.3f} s; the server can do {ceiling:.2f}"
                )
        finally:
            client.close()


def _answer(index: int, finished_s: float) -> ItemResult:
    return ItemResult(
        index, "p", "/chat/completions", {}, "a", "stop", None, 1, 0.1, None, 0.0, finished_s
    )


def test_the_window_closes_at_the_first_answer_to_finish_that_was_not_replaced() -> None:
    # bursts of 4 answers at 0.1 s intervals; calibrate decided to drain while handling the
    # burst at 0.5 s (at 0.5004 s, after all four had finished): only the first of them counts
    bursts = [0.1, 0.2, 0.3, 0.4, 0.5]
    items = tuple(
        _answer(4 * b + k + 1, t + k * 0.0001) for b, t in enumerate(bursts) for k in range(4)
    )
    run = LoopRun(items, 0.6, full_s=0.0, stop_s=0.5004)
    assert steady_throughput(run).completions == 3 + 4 * 3 + 4, "what the decision's clock counts"
    closed = run.closed_by(items[-4:])  # the last burst: none of its answers was replaced
    steady = steady_throughput(closed)
    assert closed.closed_s == 0.5
    assert steady.completions == 3 + 4 * 3 + 1
    assert steady.items_per_s == pytest.approx(4 / 0.1, rel=1e-3)
    # a run that never began its drain (a stuck request) keeps its own end
    assert LoopRun(items, 0.6, 0.0, None).closed_by(items[-4:]).closed_s is None
