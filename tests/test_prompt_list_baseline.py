"""Prompt-list mode compares like with like (issue 37): its outputs are raw ``/v1/completions``
texts, never put through the chat template ``single``'s baseline went through. Compared with the
chat baseline they matched nowhere — "0 of 330 outputs match the baseline at batch 1: not
batch-invariant", false at batch 1 on any engine with a chat template. The ladder now takes its
own baseline: the fixed prompt alone in one list. The mock's ``--chat-template`` answers a chat
message otherwise than the same raw text, as a real engine does.
"""

from __future__ import annotations

from pathlib import Path

from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate

LIST = FAST.replace("[ladder]\n", '[ladder]\nmode = "prompt-list"\nbatch_sizes = [1, 2, 4]\n')


def test_the_mocks_chat_template_answers_a_chat_otherwise_than_the_raw_text() -> None:
    import requests

    with start_mock(ttft_s=0.001, per_token_s=0.0001, chat_template=True) as mock:
        chat = requests.post(
            f"{mock.base_url}/chat/completions",
            json={"model": "internlm-s2", "messages": [{"role": "user", "content": "hi there"}]},
            timeout=10,
        ).json()["choices"][0]["message"]["content"]
        raw = requests.post(
            f"{mock.base_url}/completions",
            json={"model": "internlm-s2", "prompt": "hi there"},
            timeout=10,
        ).json()["choices"][0]["text"]
    assert chat != raw


def test_prompt_list_at_batch_1_never_claims_non_invariance(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, chat_template=True) as mock:
        open_gate(isolated, mock.base_url, LIST)
        assert cli("single").code == 0  # the chat baseline
        result = cli("ladder", "--json", "--require-match")
    assert result.code == 0, result.err
    tiers = result.json["tiers_detail"]
    assert [t["baseline_match"] for t in tiers] == [t["baseline_items"] for t in tiers]
    assert all(t["baseline_items"] > 0 for t in tiers)
    assert "not batch-invariant" not in result.err
    assert result.json["baseline_mismatch"] == []


def test_prompt_list_still_tells_a_server_that_is_not_batch_invariant(cli, isolated: Path) -> None:
    """Above 2 in flight the mock's answers change: the list's own baseline still sees it."""
    with start_mock(
        ttft_s=0.002, per_token_s=0.0005, chat_template=True, nondeterministic_above=2
    ) as mock:
        open_gate(isolated, mock.base_url, LIST)
        assert cli("single").code == 0
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    notes = result.json["baseline_mismatch"]
    assert len(notes) == 1 and "at batch 4" in notes[0]
    assert "the prompt-list baseline (the fixed prompt alone in one list)" in notes[0]
