"""The mock server: its behaviour model alone, then over real HTTP, then as a command."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from calibrate.cli import main
from calibrate.mock import MockModel, MockSettings
from calibrate.mock import text as mock_text
from tests.mockserver import RunningMock, start_mock, start_mock_process

FAST: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0002}
CHAT = {"model": "internlm-s2", "messages": [{"role": "user", "content": "What is an array?"}]}


def _model(**kw: Any) -> MockModel:
    return MockModel(MockSettings(**(FAST | kw)))


def _text(model: MockModel, prompt: str, max_tokens: int | None = None) -> tuple[str, str]:
    adm = model.admit()
    gen = model.generate(prompt, max_tokens, adm)
    model.release(adm)
    return gen.text, gen.finish_reason


# --- the behaviour model ---------------------------------------------------------------------


def test_text_is_deterministic_and_text_seed_changes_it() -> None:
    a, b, c = _model(), _model(), _model(text_seed=1)
    assert _text(a, "hello") == _text(b, "hello")
    assert _text(a, "hello")[0] != _text(c, "hello")[0]
    assert _text(a, "hello")[0] != _text(a, "hello again")[0]
    n = mock_text.count_tokens(_text(a, "hello")[0])
    assert mock_text.MIN_WORDS <= n <= mock_text.MAX_WORDS


def test_tokens_are_words_and_cjk_characters() -> None:
    assert mock_text.count_tokens("two words") == 2
    assert mock_text.count_tokens("定长数组 ok") == 5
    for prompt in ("hello", "用一句话说明什么是定长数组。", "x [json]"):
        out = mock_text.natural_text(prompt, 0)
        assert "".join(mock_text.pieces(out)) == out
        assert len(mock_text.pieces(out)) == mock_text.count_tokens(out)


def test_max_tokens_cuts_and_reports_length() -> None:
    model = _model()
    full, finish = _text(model, "hello")
    assert finish == "stop"
    cut, finish = _text(model, "hello", max_tokens=5)
    assert finish == "length" and mock_text.count_tokens(cut) == 5 and full.startswith(cut)


def test_markers() -> None:
    model = _model()
    out, _ = _text(model, "summarise [json]")
    assert out.startswith("```json\n") and out.endswith("\n```")
    assert set(json.loads(out[8:-4])) == {"summary", "n"}
    bad, _ = _text(model, "summarise [badjson]")
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad[8:-4])
    assert _text(model, "[preamble] x")[0].startswith("Sure, here is the summary:\n")
    assert _text(model, "[zh-preamble] x")[0].startswith("好的，以下是总结：\n")
    assert _text(_model(whitespace_variant=True), "hello")[0] == _text(model, "hello")[0] + " \n"


def test_slots_queue_first_come_first_served() -> None:
    model = _model(slots=2)
    first, second, third, fourth = (model.admit() for _ in range(4))
    assert model.acquire(first) and model.acquire(second)
    order: list[int] = []

    def wait(adm: Any) -> None:
        model.acquire(adm)
        order.append(adm.ticket)

    waiters = [threading.Thread(target=wait, args=(adm,)) for adm in (third, fourth)]
    for t in waiters:
        t.start()
        time.sleep(0.02)
    snap = model.snapshot()
    assert (snap.in_flight, snap.running, snap.waiting) == (4, 2, 2)
    model.release(first)
    waiters[0].join(2)
    assert order == [third.ticket]
    model.release(second)
    waiters[1].join(2)
    assert order == [third.ticket, fourth.ticket]
    assert not model.acquire(model.admit(), timeout_s=0.01)  # both slots busy: it times out


def test_vram_accounting_and_cap() -> None:
    model = _model(vram_total_mib=10240, vram_base_mib=4096, vram_per_request_mib=2048)
    adms = [model.admit() for _ in range(2)]
    snap = model.snapshot()
    # admitted, not yet running: the cache holds nothing of them (vLLM's kv_cache_usage_perc)
    assert snap.vram_used_mib == 4096 + 2 * 2048 and snap.kv_cache_usage == 0.0
    assert all(model.seat(adm, model.queue_up(adm)) for adm in adms)
    assert model.snapshot().kv_cache_usage == pytest.approx(4 / 6)
    adms += [model.admit(weight=3)]  # a 3-prompt completions request counts 3 sequences
    assert model.seat(adms[-1], model.queue_up(adms[-1]))
    snap = model.snapshot()
    assert snap.in_flight == 5 and snap.vram_used_mib == 10240 and snap.kv_cache_usage == 1.0
    for adm in adms:
        model.release(adm)
    snap = model.snapshot()
    assert snap.vram_used_mib == 4096 and snap.vram_peak_mib == 10240 and snap.in_flight == 0


def test_oom_slow_and_nondeterminism_above_thresholds() -> None:
    model = _model(oom_at=2, slow_above=1, slow_factor=5.0, nondeterministic_above=1)
    a, b, c = (model.admit() for _ in range(3))
    assert [x.outcome for x in (a, b, c)] == ["ok", "ok", "oom"]
    assert b.per_token_s == pytest.approx(5 * a.per_token_s)
    for adm in (a, b):  # the answer varies with the sequences running beside it when seated
        assert model.seat(adm, model.queue_up(adm))
    assert model.batch_varied(a) is None and model.batch_varied(b) == 2
    base = model.generate("hello", None, a).text
    changed = model.generate("hello", None, b).text
    assert changed != base and model.generate("hello", None, b).text == changed
    diff = [x for x, y in zip(base.split(), changed.split(), strict=True) if x != y]
    assert len(diff) == 1


def test_faults_are_reproducible_from_the_seed() -> None:
    rates = {"fail_rate": 0.2, "reset_rate": 0.2, "overload_rate": 0.2, "truncate_rate": 0.3}

    def run(seed: int) -> list[tuple[str, bool]]:
        model = _model(seed=seed, slow_rate=0.5, slow_s=0.5, **rates)
        out: list[tuple[str, bool]] = []
        for _ in range(40):
            adm = model.admit()
            out.append((adm.outcome, adm.truncate))
            model.release(adm)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)
    outcomes = {o for o, _ in run(7)}
    assert outcomes == {"ok", "fail", "reset", "overload"}


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="fail_rate"):
        MockSettings(fail_rate=1.5)
    for drifting in ({"slow_after": -1}, {"slow_after": 3, "slow_after_factor": 0.0}):
        with pytest.raises(ValueError, match="slow_after must be ≥ 0 and slow_after_factor > 0"):
            MockSettings(**drifting)


def test_a_server_that_drifts_answers_slower_after_its_first_n_requests() -> None:
    """``--slow-after 3 --slow-after-factor 4``: requests 1–3 as set, every one after 4× as
    long, first token and each token after it (what batch's drift watch is tested on)."""
    model = _model(slow_after=3, slow_after_factor=4.0)
    times = []
    for _ in range(5):
        adm = model.admit()
        times.append((adm.ttft_s, adm.per_token_s))
        model.release(adm)
    assert times[:3] == [(0.001, 0.0002)] * 3
    assert times[3:] == [(0.004, 0.0008)] * 2


# --- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture
def server() -> Any:
    with start_mock(**FAST) as running:
        yield running


@pytest.fixture
def http() -> Any:
    with requests.Session() as session:
        yield session


def _sse(resp: requests.Response) -> list[Any]:
    events = [line[6:] for line in resp.text.split("\n\n") if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def test_chat_and_completions(server: RunningMock, http: requests.Session) -> None:
    chat = http.post(f"{server.base_url}/chat/completions", json=CHAT, timeout=5).json()
    assert chat["object"] == "chat.completion" and chat["system_fingerprint"] == "fp_mock_0"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    usage = chat["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    body = {"model": "internlm-s2", "prompt": ["one", "two", "one"], "max_tokens": 4}
    comp = http.post(f"{server.base_url}/completions", json=body, timeout=5).json()
    assert [c["index"] for c in comp["choices"]] == [0, 1, 2]
    assert comp["choices"][0]["text"] == comp["choices"][2]["text"] != comp["choices"][1]["text"]
    assert {c["finish_reason"] for c in comp["choices"]} == {"length"}
    assert comp["usage"]["completion_tokens"] == 12 and comp["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_streaming_matches_the_full_answer(
    server: RunningMock, http: requests.Session, kind: str
) -> None:
    path, body = ("chat/completions", CHAT) if kind == "chat" else ("completions", {"prompt": "x"})
    full = http.post(f"{server.base_url}/{path}", json=body, timeout=5).json()
    stream_body = body | {"stream": True, "stream_options": {"include_usage": True}}
    resp = http.post(f"{server.base_url}/{path}", json=stream_body, timeout=5)
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = _sse(resp)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == full["usage"]
    chunks = events[:-2]
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    if kind == "chat":
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert streamed == full["choices"][0]["message"]["content"]
    else:
        assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]


def test_stream_variants(http: requests.Session) -> None:
    body = CHAT | {"stream": True, "stream_options": {"include_usage": True}}
    with start_mock(**FAST) as plain:
        events = _sse(http.post(f"{plain.base_url}/chat/completions", json=CHAT | {"stream": True}))
        assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])
    with start_mock(**FAST, no_done=True, usage_in_last_chunk=True) as variant:
        events = _sse(http.post(f"{variant.base_url}/chat/completions", json=body))
        assert "[DONE]" not in events
        assert events[-1]["choices"][0]["finish_reason"] and events[-1]["usage"]["total_tokens"]
    with start_mock(**FAST, no_usage=True) as bare:
        events = _sse(http.post(f"{bare.base_url}/chat/completions", json=body))
        assert all("usage" not in e for e in events[:-1])
        assert "usage" not in http.post(f"{bare.base_url}/chat/completions", json=CHAT).json()


def test_models_health_metrics(server: RunningMock, http: requests.Session) -> None:
    models = http.get(f"{server.base_url}/models", timeout=5).json()
    assert models["object"] == "list"
    (entry,) = models["data"]
    assert entry["id"] == "internlm-s2" and entry["root"] == "/models/internlm-s2"
    assert entry["owned_by"] == "calibrate-mock" and entry["max_model_len"] == 4096
    root = server.base_url.removesuffix("/v1")
    health = http.get(f"{root}/health", timeout=5)
    assert health.status_code == 200 and health.content == b""
    assert http.get(f"{root}/props", timeout=5).status_code == 404
    http.post(f"{server.base_url}/chat/completions", json=CHAT, timeout=5)
    text = http.get(f"{root}/metrics", timeout=5).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)", line)
            assert match, line
            values[match[1] + (match[2] or "")] = float(match[3])
    assert "# TYPE mock_vram_used_bytes gauge" in text
    assert values["mock_vram_used_bytes"] == 40960 * 2**20
    assert values["mock_vram_total_bytes"] == 81920 * 2**20
    assert values['vllm:num_requests_running{model_name="internlm-s2"}'] == 0
    assert values['vllm:kv_cache_usage_perc{model_name="internlm-s2"}'] == 0
    assert values['mock_requests_total{outcome="ok"}'] == 1


def test_metrics_see_requests_in_flight(http: requests.Session) -> None:
    # answers that take 2 s: /metrics is read while both are surely in flight, even on a busy box
    with start_mock(ttft_s=2.0, per_token_s=0.0) as slow, ThreadPoolExecutor(2) as pool:
        pending = [pool.submit(requests.post, f"{slow.base_url}/chat/completions", json=CHAT)]
        pending.append(pool.submit(requests.post, f"{slow.base_url}/chat/completions", json=CHAT))
        deadline = time.monotonic() + 1.5
        while slow.model.snapshot().in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        snap = slow.model.snapshot()
        text = http.get(slow.base_url.removesuffix("/v1") + "/metrics").text
        assert [f.result().status_code for f in pending] == [200, 200]
    assert snap.in_flight == 2 and f"mock_vram_used_bytes {(40960 + 4096) * 2**20}" in text


def test_errors_unknown_model_and_bad_bodies(server: RunningMock, http: requests.Session) -> None:
    url = f"{server.base_url}/chat/completions"
    resp = http.post(url, json=CHAT | {"model": "x"}, timeout=5)
    assert resp.status_code == 404
    assert resp.json() == {
        "object": "error",
        "message": "The model `x` does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    for bad in (b"not json", b'{"model": "internlm-s2"}', b'{"messages": "hi"}', b"[1]"):
        resp = http.post(url, data=bad, timeout=5)
        assert resp.status_code == 400 and resp.json()["object"] == "error", bad
    resp = http.post(f"{server.base_url}/completions", json={"prompt": [1, 2]}, timeout=5)
    assert resp.status_code == 400
    with start_mock(**FAST, unknown_model_status=400, strict_422=True) as other:
        url = f"{other.base_url}/chat/completions"
        assert http.post(url, json=CHAT | {"model": "x"}, timeout=5).status_code == 400
        resp = http.post(url, json={"messages": 3}, timeout=5)
        assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "messages"]


def test_faults_over_http(http: requests.Session) -> None:
    with start_mock(**FAST, overload_rate=1.0, retry_after_s=2) as busy:
        resp = http.post(f"{busy.base_url}/chat/completions", json=CHAT, timeout=5)
        assert resp.status_code == 429 and resp.headers["Retry-After"] == "2"
        assert resp.json()["code"] == 429
    with start_mock(**FAST, oom_at=0) as oom:
        resp = http.post(f"{oom.base_url}/chat/completions", json=CHAT, timeout=5)
        assert resp.status_code == 500
        assert "CUDA out of memory. Tried to allocate 2.00 GiB" in resp.json()["message"]
    with start_mock(**FAST, fail_rate=1.0) as failing:
        assert http.post(f"{failing.base_url}/completions", json={"prompt": "x"}).status_code == 500
    with start_mock(**FAST, truncate_rate=1.0) as cut:
        choice = http.post(f"{cut.base_url}/completions", json={"prompt": "x"}).json()["choices"][0]
        assert choice["finish_reason"] == "length"
    with start_mock(**FAST, reset_rate=1.0) as dropping:
        with pytest.raises(requests.ConnectionError):
            http.post(f"{dropping.base_url}/chat/completions", json=CHAT, timeout=5)
        with pytest.raises(requests.exceptions.RequestException):
            body = CHAT | {"stream": True}
            http.post(f"{dropping.base_url}/chat/completions", json=body, timeout=5)
        assert dropping.model.snapshot().in_flight == 0


def _post_many(url: str, body: dict[str, Any], n: int) -> tuple[list[int], float]:
    with ThreadPoolExecutor(n) as pool:
        started = time.perf_counter()
        codes = list(pool.map(lambda _: requests.post(url, json=body).status_code, range(n)))
        return codes, time.perf_counter() - started


@pytest.mark.serial  # wall-clock bounds: run alone, not beside three other workers
def test_slots_make_a_knee_and_connections_burst_without_stalls() -> None:
    with start_mock(ttft_s=0.1, per_token_s=0.0, slots=2) as knee:
        codes, elapsed = _post_many(f"{knee.base_url}/completions", {"prompt": "x"}, 4)
    assert codes == [200] * 4 and 0.2 <= elapsed < 0.5  # two waves of two
    with start_mock(ttft_s=0.3, per_token_s=0.0) as wide:
        codes, elapsed = _post_many(f"{wide.base_url}/chat/completions", CHAT, 128)
    assert codes == [200] * 128 and elapsed < 1.2  # a dropped SYN alone would cost 1 s more


# --- the command --------------------------------------------------------------------------------


def test_mock_command_serves_and_stops_cleanly(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = start_mock_process("--port-file", str(port_file), "--expose-props", "--slots", "3")
    try:
        assert proc.base_url == f"http://127.0.0.1:{proc.port}/v1"
        assert int(port_file.read_text()) == proc.port
        root = proc.base_url.removesuffix("/v1")
        assert requests.get(f"{root}/props", timeout=5).json()["total_slots"] == 3
    finally:
        assert proc.stop() == 0
    with start_mock_process("--model", "a", "--model", "b") as named:
        ids = [m["id"] for m in requests.get(f"{named.base_url}/models", timeout=5).json()["data"]]
        assert ids == ["a", "b"]
        assert named.stop(signal.SIGINT) == 0


def test_mock_command_refuses_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mock", "--fail-rate", "2", "--port", "0"]) == 2
    assert "fail_rate" in capsys.readouterr().err


class _RecordingWire:
    """A Wire that keeps what the answer writes, in order, and answers at once."""

    def __init__(self, settings: MockSettings, said: list[str]) -> None:
        self.settings, self.said = settings, said

    def sse_headers(self) -> None:
        self.said.append("headers")

    def write_chunk(self, frame: bytes) -> None:
        self.said.append("[DONE]" if b"[DONE]" in frame else "event")

    def write(self, data: bytes) -> None:
        self.said.append("end")

    def send_json(self, status: int, body: object, headers: object = None, **_: object) -> None:
        self.said.append(f"body {status}")

    def wait_until(self, deadline: float) -> None:  # no client to leave: the time passes
        time.sleep(max(0.0, deadline - time.monotonic()))


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_leaves_the_batch_before_its_last_bytes_go_out(stream: bool) -> None:
    """As in an engine, a sequence is out of the batch once its last token is generated: the
    client's next request, sent the moment it has the answer, never meets this one still in
    flight (under four test workers a ladder's wave of 2 was seen as 3, and the mock's
    --nondeterministic-above 2 changed an answer at batch 2)."""
    from calibrate.mock.openai.request import parse_request
    from calibrate.mock.reply import answer

    settings = MockSettings(ttft_s=0.0, per_token_s=0.0)
    model = MockModel(settings)
    said: list[str] = []
    body = {"model": "internlm-s2", "messages": [{"role": "user", "content": "hi"}]}
    req = parse_request("chat", body | {"stream": stream, "max_tokens": 3}, settings)
    adm = model.admit(1)

    def generated() -> None:
        said.append(f"released, {model.snapshot().in_flight} in flight before")
        model.release(adm)

    answer(_RecordingWire(settings, said), req, adm, model, {}, generated)  # type: ignore[arg-type]
    last = "[DONE]" if stream else "body 200"
    assert said.index("released, 1 in flight before") == said.index(last) - 1, said
    assert model.snapshot().in_flight == 0


def test_answers_to_repeated_prompts_are_remembered_and_long_prompts_never_are() -> None:
    """The mock makes a prompt's answer once (every wave of the fixed prompt asks it again),
    and keeps no long prompt alive for it: a context ladder's prompts run to megabytes."""
    short, long = "what is 2+2? [memo test]", "word " * (mock_text.MEMO_CHARS // 5 + 1)
    first = mock_text.natural_text(short, 7)
    before = mock_text._natural_memo.cache_info()
    assert mock_text.natural_text(short, 7) == first
    assert mock_text._natural_memo.cache_info().hits == before.hits + 1
    assert mock_text.natural_text(long, 7) == mock_text.natural_text(long, 7)  # made twice
    assert mock_text._natural_memo.cache_info().currsize == before.currsize
    assert mock_text.count_tokens(long) == mock_text.count_tokens(long) == len(long.split())
