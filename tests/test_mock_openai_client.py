"""The official ``openai`` client accepts everything the mock answers."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from tests.mockserver import RunningMock, start_mock

if TYPE_CHECKING:
    import openai
else:

    class _Imported:
        """``openai``, imported when a test first asks for it: at collection every pytest-xdist
        worker imported it (0.9 s of the suite's 2.5 s collection, -X importtime)."""

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_"):  # what pytest asks of every module-level name it collects
                raise AttributeError(name)
            import openai as module

            module_: ModuleType = module
            return getattr(module_, name)

    openai = _Imported()

MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "user", "content": "用一句话说明什么是定长数组。"}
]


@pytest.fixture
def client() -> Iterator[tuple[openai.OpenAI, RunningMock]]:
    with (
        start_mock(ttft_s=0.001, per_token_s=0.0002) as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as api,
    ):
        yield api, server


def test_chat_non_streaming(client: tuple[openai.OpenAI, RunningMock]) -> None:
    api, _ = client
    resp = api.chat.completions.create(
        model="internlm-s2", messages=MESSAGES, temperature=0, max_tokens=128, seed=0
    )
    assert resp.object == "chat.completion" and resp.model == "internlm-s2"
    assert resp.system_fingerprint == "fp_mock_0"
    choice = resp.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content
    assert resp.usage is not None and resp.usage.completion_tokens == len(choice.message.content)


def test_chat_streaming_with_usage(client: tuple[openai.OpenAI, RunningMock]) -> None:
    api, _ = client
    with api.chat.completions.create(
        model="internlm-s2",
        messages=MESSAGES,
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert len(text) == 10 and finish[-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10


def test_completions_prompt_list_and_streaming(client: tuple[openai.OpenAI, RunningMock]) -> None:
    api, _ = client
    resp = api.completions.create(model="internlm-s2", prompt=["a [json]", "b"], max_tokens=64)
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.choices[0].text.startswith("```json")
    with api.completions.create(model="internlm-s2", prompt="b", max_tokens=64, stream=True) as s:
        streamed = "".join(c.choices[0].text for c in s if c.choices)
    assert streamed == resp.choices[1].text


def test_models_and_errors(client: tuple[openai.OpenAI, RunningMock]) -> None:
    api, _ = client
    assert [m.id for m in api.models.list()] == ["internlm-s2"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        api.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        api.completions.create(model="internlm-s2", prompt="x", max_tokens=5000)


def test_faults_map_to_client_errors() -> None:
    with (
        start_mock(ttft_s=0.001, per_token_s=0.0, overload_rate=1.0) as busy,
        openai.OpenAI(base_url=busy.base_url, api_key="sk-test", max_retries=0) as api,
        pytest.raises(openai.RateLimitError),
    ):
        api.chat.completions.create(model="internlm-s2", messages=MESSAGES)
    with (
        start_mock(ttft_s=0.001, per_token_s=0.0, oom_at=0) as oom,
        openai.OpenAI(base_url=oom.base_url, api_key="sk-test", max_retries=0) as api,
        pytest.raises(openai.InternalServerError, match="CUDA out of memory"),
    ):
        api.chat.completions.create(model="internlm-s2", messages=MESSAGES)
    with (
        start_mock(ttft_s=0.001, per_token_s=0.0, reset_rate=1.0) as dropping,
        openai.OpenAI(base_url=dropping.base_url, api_key="sk-test", max_retries=0) as api,
        pytest.raises(openai.APIConnectionError),
    ):
        api.chat.completions.create(model="internlm-s2", messages=MESSAGES)
