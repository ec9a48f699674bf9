"""The mock whose memory grows with tokens (issue 12), over real HTTP: KV capacity and what a full
cache does, preallocation, the prefix cache, forced answer lengths, the step cost, jitter and the
engines' metric names."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import requests

from calibrate.gpu import prometheus
from calibrate.mock import text as mock_text
from calibrate.mock.kv import SeqPlan
from calibrate.mock.model import MockModel
from calibrate.mock.settings import MockSettings
from tests.mockserver import RunningMock, start_mock, start_mock_process

FAST: dict[str, Any] = {"ttft_s": 0.005, "per_token_s": 0.0005}
# 3,000-token prompts + 200 forced tokens: 4 fit in 20,000 tokens of KV, 8 do not.
KV: dict[str, Any] = {"ttft_s": 0.005, "per_token_s": 0.001, "kv_capacity_tokens": 20000}
KV |= {"kv_mib_per_1k_tokens": 128.0}
# 2 s answers (10 ms a token) for the tests that need a whole wave resident together: under
# parallel test workers the eight 3,000-token requests of a wave reach the mock up to ~0.3 s
# apart, and with 0.2 s answers the first were done before the last came, so nothing waited;
# beside two CPU burners (burner run p1) they came further apart than 0.8 s answers last
TOGETHER: dict[str, Any] = KV | {"per_token_s": 0.01}
PROMPT_TOKENS = 3000
CHAT_OVERHEAD = 6  # one message: 4 tokens around it and 2 to start the reply


def _prompt(tag: str, n: int = PROMPT_TOKENS) -> str:
    """``n`` tokens; a different ``tag`` makes every token, the first one included, different."""
    return " ".join(f"{tag}w{i}" for i in range(n))


def _chat(mock: RunningMock, content: str, **extra: Any) -> requests.Response:
    body = {"model": "internlm-s2", "messages": [{"role": "user", "content": content}]} | extra
    return requests.post(f"{mock.base_url}/chat/completions", json=body, timeout=30)


def _forced(mock: RunningMock, content: str, out: int = 200) -> requests.Response:
    return _chat(mock, content, max_tokens=out, min_tokens=out, ignore_eos=True)


def _wave(mock: RunningMock, prompts: list[str], out: int = 200) -> list[requests.Response]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: _forced(mock, p, out), prompts))


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name → its largest value over label sets (what the samplers read)."""
    scrape = prometheus.parse_prometheus(text)
    return {
        name: value for name in scrape if (value := prometheus.max_value(scrape, name)) is not None
    }


def _metrics(mock: RunningMock) -> dict[str, float]:
    base = mock.base_url.removesuffix("/v1")
    return parse_prometheus(requests.get(f"{base}/metrics", timeout=5).text)


@contextmanager
def _sampling(mock: RunningMock, interval_s: float = 0.02) -> Iterator[list[dict[str, float]]]:
    """Scrape /metrics over and over while the block runs; the samples land in the list. Every
    state read here lasts a wave of 40-200 steps (0.5 s or more): every 20 ms finds it, where
    every 5 ms each test's scrapes cost about a third of a core (the mock's and the parse)."""
    samples: list[dict[str, float]] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            samples.append(_metrics(mock))
            stop.wait(interval_s)

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(5)


def _timed(call: Callable[[], list[requests.Response]]) -> tuple[float, list[requests.Response]]:
    start = time.monotonic()
    out = call()
    return time.monotonic() - start, out


# --- capacity and a full cache ----------------------------------------------------------------


def test_kv_capacity_fits_four_long_requests_and_oom_kills_some_of_eight() -> None:
    """With 0.2 s answers a loaded machine (load 15 on 2 cores) delivered the eight apart: the
    first were done before the last came, and only one failed. Answers that take 2 s keep the
    wave resident together (``TOGETHER``)."""
    with start_mock(**TOGETHER, on_kv_full="oom") as mock:
        four = _wave(mock, [_prompt(f"a{k}") for k in range(4)])
        assert [r.status_code for r in four] == [200] * 4
        usage = four[0].json()["usage"]
        assert usage["prompt_tokens"] == PROMPT_TOKENS + CHAT_OVERHEAD
        assert usage["completion_tokens"] == 200
        eight = _wave(mock, [_prompt(f"b{k}") for k in range(8)])
        failed = [r for r in eight if r.status_code != 200]
        # 6 prompts of 3,006 tokens fit in 20,000 (and grow to 19,236); the 7th and 8th do not.
        assert len(failed) == 2
        assert all(r.status_code == 500 for r in failed)
        assert all("CUDA out of memory" in r.json()["message"] for r in failed)
        assert _metrics(mock)["mock_kv_tokens_used"] == 0  # everything given back


def test_oom_while_growing_ends_a_stream_with_an_error_event() -> None:
    # Two prompts of 3,006 fit in 6,100 tokens; their answers cannot both grow by 100.
    with start_mock(**(KV | {"kv_capacity_tokens": 6100}), on_kv_full="oom") as mock:

        def stream(tag: str) -> str:
            body = {
                "model": "internlm-s2",
                "messages": [{"role": "user", "content": _prompt(tag)}],
                "max_tokens": 100,
                "ignore_eos": True,
                "stream": True,
            }
            url = f"{mock.base_url}/chat/completions"
            return requests.post(url, json=body, timeout=30).text

        with ThreadPoolExecutor(2) as pool:
            texts = list(pool.map(stream, ["s1", "s2"]))
        assert sum("CUDA out of memory" in t for t in texts) >= 1
        assert all(t.rstrip().endswith("data: [DONE]") for t in texts)


def test_preempt_answers_everything_but_each_item_costs_more() -> None:
    settings = TOGETHER | {"on_kv_full": "preempt"}
    with start_mock(**settings) as mock:
        wall4, four = _timed(lambda: _wave(mock, [_prompt(f"a{k}") for k in range(4)]))
        with _sampling(mock) as samples:
            wall8, eight = _timed(lambda: _wave(mock, [_prompt(f"b{k}") for k in range(8)]))
        after = _metrics(mock)
    assert [r.status_code for r in four + eight] == [200] * 12
    assert all(r.json()["choices"][0]["finish_reason"] == "length" for r in eight)
    # Two of eight sequences do not fit: every step recomputes them, three times the work (the
    # rule itself is tested on the model below: a wall-time ratio on a loaded machine is luck).
    assert wall8 > wall4, (wall4, wall8)
    assert max(s["vllm:kv_cache_usage_perc"] for s in samples) == 1.0
    assert max(s["vllm:num_requests_waiting"] for s in samples) == 2  # preempted, to recompute
    # vLLM's counter of preemptions: the ladder's stop: preempt reads it
    assert after["vllm:num_preemptions_total"] >= 2


def test_preemption_recomputes_the_evicted_sequences_every_step_and_counts_them() -> None:
    model = MockModel(MockSettings(**(KV | {"on_kv_full": "preempt"})))
    admitted = []
    for _ in range(8):  # 8 prompts of 3,006 tokens in 20,000: the 7th and 8th are evicted
        adm = model.admit()
        assert model.start(adm, [SeqPlan.of("", 3006, 200, share=False)])
        admitted.append(adm)
    assert model.step_s(admitted[0]) == pytest.approx(KV["per_token_s"] * 3)
    assert model.snapshot().preemptions_total == 2
    for adm in admitted:
        model.release(adm)
    after = model.snapshot()
    assert after.preemptions_total == 2 and after.kv_tokens_in_use == 0, "a counter never falls"
    plain = MockModel(MockSettings(**(KV | {"on_kv_full": "oom"})))
    adm = plain.admit()
    assert plain.start(adm, [SeqPlan.of("", 3006, 200, share=False)])
    assert plain.snapshot().preemptions_total == 0


def test_queue_waits_for_kv_and_the_queue_gauge_says_so() -> None:
    settings = TOGETHER | {"on_kv_full": "queue", "metrics_style": "vllm"}
    with start_mock(**settings) as mock:
        with _sampling(mock) as samples:
            wall8, eight = _timed(lambda: _wave(mock, [_prompt(f"q{k}") for k in range(8)]))
        after = _metrics(mock)
    assert [r.status_code for r in eight] == [200] * 8
    waiting = [s["vllm:num_requests_waiting"] for s in samples]
    assert max(waiting) == 2  # 6 × 3,206 tokens fit in 20,000; two wait for room
    assert max(s["vllm:kv_cache_usage_perc"] for s in samples) <= 1.0
    assert after["vllm:num_requests_waiting"] == 0
    assert wall8 > 2 * 200 * TOGETHER["per_token_s"]  # two rounds of 200 tokens


def test_preallocated_memory_is_flat_while_kv_usage_rises() -> None:
    settings = TOGETHER | {"preallocate": True, "metrics_style": "sglang"}
    with start_mock(**settings) as mock:
        before = _metrics(mock)
        with _sampling(mock) as samples:
            _wave(mock, [_prompt(f"p{k}") for k in range(4)])
    reserved = (40960 + 20000 * 128 / 1000) * 1024 * 1024
    used = {s["mock_vram_used_bytes"] for s in [before, *samples]}
    assert used == {reserved}
    assert before["sglang:token_usage"] == 0
    assert max(s["sglang:token_usage"] for s in samples) > 0.5  # 4 × 3,206 / 20,000


def test_used_memory_grows_with_tokens_without_preallocation() -> None:
    with start_mock(**KV) as mock:
        idle = _metrics(mock)["mock_vram_used_bytes"]
        _wave(mock, [_prompt(f"g{k}") for k in range(4)])
        peak = _metrics(mock)["mock_vram_peak_bytes"]
    assert idle == 40960 * 1024 * 1024
    kv_mib = 4 * (PROMPT_TOKENS + CHAT_OVERHEAD + 200) * 128 / 1000
    assert peak == pytest.approx((40960 + kv_mib) * 1024 * 1024, rel=0.001)


def test_prefix_cache_holds_identical_prompts_once() -> None:
    settings = TOGETHER | {"kv_capacity_tokens": 100_000, "prefix_cache": True}
    same = [_prompt("same")] * 8
    unique = [_prompt(f"u{k}") for k in range(8)]
    peaks = []
    for prompts in (same, unique):
        with start_mock(**settings) as mock:
            assert [r.status_code for r in _wave(mock, prompts)] == [200] * 8
            peaks.append(_metrics(mock)["mock_vram_peak_bytes"] / 1024 / 1024 - 40960)
    shared_mib, unique_mib = peaks
    # eight unique prompts held together, each its own blocks: at least their prompts, at most
    # prompts and whole answers (the exact peak needs the eight admitted at the same instant:
    # under four test workers they were up to ~0.3 s apart and the first answers were freed
    # before the last ones' final tokens, 3,206 of 3,283 MiB)
    prompt_tokens = PROMPT_TOKENS + CHAT_OVERHEAD
    mib_per_token = KV["kv_mib_per_1k_tokens"] / 1000
    assert 8 * prompt_tokens * mib_per_token <= unique_mib
    assert unique_mib <= 8 * (prompt_tokens + 200) * mib_per_token * 1.01
    assert shared_mib < unique_mib / 4  # one prompt's blocks, eight answers


def test_prefix_cache_shares_a_common_prefix_only() -> None:
    settings = TOGETHER | {"kv_capacity_tokens": 100_000, "prefix_cache": True}
    system = _prompt("sys", 2000)
    prompts = [f"{system} {_prompt(f't{k}', 1000)}" for k in range(4)]
    with start_mock(**settings) as mock, _sampling(mock) as samples:
        _wave(mock, prompts)
    held = max(s["mock_kv_tokens_used"] for s in samples)
    # 2,000 shared tokens once, then each request's own 1,000 (+ its answer): not 4 × 3,000.
    assert 2000 + 4 * 1006 <= held <= 2000 + 4 * (1006 + 200 + 16)


# --- answer lengths ---------------------------------------------------------------------------


def test_ignore_eos_min_tokens_and_max_tokens_set_the_answer_length() -> None:
    with start_mock(**FAST) as mock:
        forced = _chat(mock, "hello", max_tokens=200, ignore_eos=True).json()
        assert forced["usage"]["completion_tokens"] == 200
        assert forced["choices"][0]["finish_reason"] == "length"
        assert mock_text.count_tokens(forced["choices"][0]["message"]["content"]) == 200
        longer = _chat(mock, "hello", max_tokens=300, min_tokens=100).json()
        assert longer["usage"]["completion_tokens"] == 100
        assert longer["choices"][0]["finish_reason"] == "stop"
        natural = _chat(mock, "hello").json()
        assert natural["usage"]["completion_tokens"] <= mock_text.MAX_WORDS
        assert natural["choices"][0]["finish_reason"] == "stop"
        capped = _chat(mock, "hello", max_tokens=5).json()
        assert capped["usage"]["completion_tokens"] == 5
        assert capped["choices"][0]["finish_reason"] == "length"
        bad = _chat(mock, "hello", max_tokens=5, min_tokens=10)
        assert bad.status_code == 400 and "min_tokens" in bad.json()["message"]


def test_a_forced_stream_has_exactly_max_tokens_pieces() -> None:
    with start_mock(**FAST) as mock:
        body = {
            "model": "internlm-s2",
            "prompt": "one two three",
            "max_tokens": 64,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        lines = requests.post(f"{mock.base_url}/completions", json=body, timeout=10).text
    chunks = [ln for ln in lines.splitlines() if ln.startswith('data: {"id"')]
    pieces = [c for c in chunks if '"text": ""' not in c and '"choices": []' not in c]
    assert len(pieces) == 64
    assert '"finish_reason": "length"' in lines and '"prompt_tokens": 3' in lines


def test_max_model_len_refuses_like_vllm_and_is_reported() -> None:
    with start_mock(**FAST, max_model_len=8192) as mock:
        models = requests.get(f"{mock.base_url}/models", timeout=5).json()
        assert models["data"][0]["max_model_len"] == 8192
        too_long = _chat(mock, _prompt("x", 8000), max_tokens=500)
        assert too_long.status_code == 400
        message = too_long.json()["message"]
        assert "maximum context length is 8192 tokens. However, you requested 8506 tokens" in (
            message
        )
        assert _chat(mock, _prompt("x", 7000), max_tokens=500).status_code == 200


# --- the compute model and jitter -------------------------------------------------------------


def test_step_time_grows_with_the_tokens_in_the_batch() -> None:
    """A decode step: 0.5 ms + 1 ms per 1,000 resident tokens — the model's figure exactly (no
    clock: 3,000 tokens alone, 24,000 for eight), and over HTTP a 3,000-token prompt's 100 steps
    take at least their 350 ms (a busy machine only adds; a server that ignored the step cost
    takes ~60 ms). It compared wall times, and beside two CPU burners (burner run w2) a
    two-word prompt's 100 steps took 88 ms against the 3,000-token prompt's 100 ms."""
    settings = FAST | {"per_token_s": 0.0005, "step_ms_per_1k_tokens": 1.0}
    model = MockModel(MockSettings(**settings))
    held = []
    for k in range(8):
        admission = model.admit()
        assert model.claim(admission, [SeqPlan((), PROMPT_TOKENS, 100)])
        held.append(admission)
        if k == 0:
            assert model.step_s(admission) == pytest.approx(0.0005 + 0.003)
    assert model.step_s(held[0]) == pytest.approx(0.0005 + 0.024)
    with start_mock(**settings) as mock:
        one, answers = _timed(lambda: _wave(mock, [_prompt("one")], out=100))
    assert answers[0].status_code == 200 and one >= 100 * 0.0035, one


def _request_times(seed: int) -> list[float]:
    settings = {"ttft_s": 0.01, "per_token_s": 0.002, "jitter": 0.5, "seed": seed}
    with start_mock(**settings) as mock:
        out = []
        for _ in range(4):
            start = time.monotonic()
            assert _chat(mock, "hello", max_tokens=30, ignore_eos=True).status_code == 200
            out.append(time.monotonic() - start)
        return out


def _drawn(seed: int) -> list[float]:
    """The request times the mock draws for four requests (ttft + 30 tokens), no clock."""
    model = MockModel(MockSettings(ttft_s=0.01, per_token_s=0.002, jitter=0.5, seed=seed))
    return [(a := model.admit()).ttft_s + 30 * a.per_token_s for _ in range(4)]


def test_jitter_is_seeded() -> None:
    """The draws are the seed's (exactly: no clock in this part), they differ request to
    request and seed to seed, and the server really takes at least the drawn time."""
    first, again, other = _drawn(3), _drawn(3), _drawn(4)
    assert first == again
    assert max(first) - min(first) > 0.025, first  # the requests really differ
    assert max(abs(a - b) for a, b in zip(first, other, strict=True)) > 0.025, (first, other)
    assert all(0.035 - 1e-9 <= t <= 0.105 + 1e-9 for t in first)  # ttft, per token × [0.5, 1.5]
    # over HTTP a loaded machine only adds time: each request takes at least its draw
    for drawn, elapsed in zip(first, _request_times(3), strict=True):
        assert elapsed >= drawn - 0.002, (drawn, elapsed)


# --- metric names -----------------------------------------------------------------------------

QUEUE = {
    "vllm": "vllm:num_requests_waiting",
    "sglang": "sglang:num_queue_reqs",
    "llamacpp": "llamacpp:requests_deferred",
    "tgi": "tgi_queue_size",
}
STYLES = {
    "vllm": ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:token_usage", "sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
    "tgi": ("tgi_queue_size", "tgi_batch_current_size"),
}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_metrics_style_names_and_queue_gauge(style: str) -> None:
    # 0.5 s answers: the three must all have arrived before the first is done (at 0.2 s the third
    # came after it on a loaded machine, and the gauge read 1)
    settings = FAST | {"per_token_s": 0.0125, "slots": 1, "metrics_style": style}
    with start_mock(**settings) as mock:
        with _sampling(mock) as samples, ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda k: _forced(mock, f"q{k}", 40), range(3)))
        names = set(samples[0])
    assert set(STYLES[style]) <= names
    assert {"mock_vram_used_bytes", "mock_vram_total_bytes"} <= names
    other_engines = {n for s, ns in STYLES.items() if s != style for n in ns}
    assert not names & other_engines
    if style in ("llamacpp", "tgi"):
        assert not any("usage" in n for n in names)  # no KV gauge, as these engines
    assert max(s[QUEUE[style]] for s in samples) == 2  # one slot: two of three wait


def test_the_command_wires_every_new_flag() -> None:
    flags = ("--kv-capacity-tokens", "20000", "--kv-mib-per-1k-tokens", "64", "--preallocate")
    flags += ("--on-kv-full", "queue", "--prefix-cache", "--step-ms-per-1k-tokens", "0.01")
    flags += ("--jitter", "0.1", "--metrics-style", "sglang", "--ttft", "0.001")
    flags += ("--per-token", "0.0002")
    with start_mock_process(*flags) as proc:
        body = {"model": "internlm-s2", "prompt": _prompt("c", 100), "max_tokens": 10}
        answer = requests.post(f"{proc.base_url}/completions", json=body, timeout=10).json()
        text = requests.get(proc.base_url.removesuffix("/v1") + "/metrics", timeout=5).text
    assert answer["usage"]["prompt_tokens"] == 100
    metrics = parse_prometheus(text)
    assert metrics["mock_kv_tokens_capacity"] == 20000
    assert metrics["mock_vram_used_bytes"] == (40960 + 1280) * 1024 * 1024  # preallocated
    assert "sglang:token_usage" in metrics and "vllm:kv_cache_usage_perc" not in metrics
