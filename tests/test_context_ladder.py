"""``ladder --axis context`` (SPEC §5.3) against the mock's max_model_len, and what it feeds:
the resolver (never the batch size), status, pin's header and batch's length check; and a
forced answer cut short by a full context, named with the numbers."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from calibrate.http.models import Choice, ContextLimit, incomplete_reason
from calibrate.http.server_context import MAX_MODEL_LEN_HINT, props_context
from calibrate.stages.ladder.context_axis import (
    axis_stopped_by,
    bracket,
    next_length,
    outcome,
    relabel,
    tier_length,
)
from calibrate.stages.measure.tier import Tier
from calibrate.state.ledger import Ledger, LedgerEntry
from tests.mockserver import start_mock
from tests.stage_fakes import CLEAN
from tests.workload_helpers import FAST_MOCK, LADDER, calibrated, tiers


def test_context_ladder_steps_up_to_the_limit_the_server_reports(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        calibrated(cli, isolated, mock.base_url)
        result = cli("ladder", "--axis", "context", "--json")
    assert result.code == 0, result.err
    assert "the server's context (max_model_len): 8192 tokens, from GET /v1/models" in result.err
    lengths = [t["input_tokens_target"] for t in tiers(result)]
    # 512, 1k, 2k, 4k, then the longest that fits beside a 128-token answer (5 % margin)
    assert lengths[:4] == [512, 1024, 2048, 4096] and 7000 < lengths[-1] < 8192 - 128
    assert all(t["verdict"] == "pass" and t["batch_size"] == 1 for t in tiers(result))
    assert result.json["axis"] == "context"
    assert 7000 < result.json["context_verified"] <= 8192 - 128
    assert "longest passing input:" in result.err


def test_on_a_llamacpp_the_context_axis_steps_up_to_the_per_slot_context(
    cli, isolated: Path
) -> None:
    """llama.cpp says its per-slot context in /props (4,096 here, its whole model 32,768):
    the axis steps up to it, as the cut-short check reads it, instead of past it into
    answers cut short."""
    with start_mock(**FAST_MOCK, expose_props=True, slot_context=4096, max_model_len=32768) as mock:
        calibrated(cli, isolated, mock.base_url)
        result = cli("ladder", "--axis", "context", "--json")
    assert result.code == 0, result.err
    assert "the server's per-slot context: 4096 tokens, from GET /props" in result.err
    lengths = [t["input_tokens_target"] for t in tiers(result)]
    assert lengths[:3] == [512, 1024, 2048] and 3500 < lengths[-1] < 4096 - 128, lengths
    assert all(t["verdict"] == "pass" for t in tiers(result))
    assert 3500 < result.json["context_verified"] <= 4096 - 128


def test_a_step_over_the_context_fails_with_the_servers_400_and_is_bisected(
    cli, isolated: Path
) -> None:
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        calibrated(cli, isolated, mock.base_url)
        lengths = ("--context-lengths", "2048,4096,9000", "--batch", "2")
        result = cli("ladder", "--axis", "context", *lengths, "--json")
    assert result.code == 0, result.err  # a length passed: the ladder found the ceiling
    rows = tiers(result)
    assert [t["verdict"] for t in rows[:3]] == ["pass", "pass", "fail"]
    assert rows[2]["error_kinds"] == {"http_4xx": 2}
    assert all(t["batch_size"] == 2 for t in rows)
    assert "maximum context length is 8192 tokens" in result.err
    # the input limit beside a 128-token answer is 8,064: bisected to within 5 %
    verified = result.json["context_verified"]
    assert 0.95 * (8192 - 128) <= verified <= 8192 - 128, verified
    assert result.json["stopped_by"] == "failure"
    _bisected(rows, verified)
    assert f"longest passing input: {verified:,} tokens at batch 2" in result.err


def _bisected(rows: list[dict[str, object]], verified: int) -> None:
    """Each tier after the first failure lies between the longest pass and the shortest fail
    so far, and the last pair is within 5 % (or 256 tokens) of each other."""
    low, high = 0, None
    for row in rows:
        length = round(float(str(row["input_tokens_target"])))
        if high is not None:
            assert low < length < high, (low, length, high)
        if row["verdict"] == "pass":
            low = max(low, length)
        else:
            high = length if high is None else min(high, length)
    assert high is not None and high - low <= max(0.05 * low, 256), (low, high)
    assert abs(verified - low) <= 0.05 * low  # what the longest passing length sent


def test_the_context_axis_bisects_past_a_doubling_that_failed(cli, isolated: Path) -> None:
    # 4,096 passes, 8,192 fails; the real input limit is 5,000 - 128 = 4,872 tokens
    with start_mock(**FAST_MOCK, max_model_len=5000) as mock:
        calibrated(cli, isolated, mock.base_url)
        lengths = ("--context-lengths", "1024,2048,4096,8192")
        result = cli("ladder", "--axis", "context", *lengths, "--json")
    assert result.code == 0, result.err
    rows = tiers(result)
    assert [t["input_tokens_target"] for t in rows[:4]] == [1024, 2048, 4096, 8192]
    verified = result.json["context_verified"]
    assert 4600 < verified <= 4872, verified
    _bisected(rows, verified)
    verdict = next(line for line in result.err.splitlines() if "longest passing input" in line)
    assert f"longest passing input: {verified:,} tokens (input lengths" in verdict
    assert "batch 1" not in result.err.replace("at batch 1; 2 rounds", ""), result.err
    assert "failed, bisected to within" in verdict and "input " in verdict


def test_every_context_tier_is_said_of_its_input_length(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, max_model_len=2048) as mock:
        calibrated(cli, isolated, mock.base_url)
        result = cli("ladder", "--axis", "context", "--context-lengths", "1000,3000", "--json")
    assert result.code == 0, result.err
    rows = tiers(result)
    assert len(rows) > 2 and rows[1]["verdict"] == "fail"  # 3,000 failed: bisected below it
    for row in rows:
        length = round(float(str(row["input_tokens_target"])))
        assert str(row["reason"]).startswith(f"input {length:,} tokens: "), row["reason"]
        assert "batch 1" not in str(row["reason"])
    verified = result.json["context_verified"]
    assert 2048 - 128 - 256 <= verified <= 2048 - 128  # small lengths: within 256 tokens
    _bisected(rows, verified)


def test_a_context_axis_where_every_length_fits_does_not_bisect(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        calibrated(cli, isolated, mock.base_url)
        result = cli("ladder", "--axis", "context", "--context-lengths", "512,1000", "--json")
    assert result.code == 0, result.err
    assert [t["input_tokens_target"] for t in tiers(result)] == [512, 1000]
    assert "(every input length passed)" in result.err
    assert result.json["stopped_by"] == "completed"


def test_a_context_ladder_never_sets_the_batch_size(cli, isolated: Path) -> None:
    """A batch ladder set batch 2 (its ledger line: what it measures is not this test's, and a
    busy machine can leave a real one inconclusive); the context ladder after it steps at batch
    1. Status, the sweep and pin still take batch 2, with the context ladder's verified input."""
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        server = '[server]\nmodel_path = "/models/m"\n'
        sweep = "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 1\n"
        calibrated(cli, isolated, mock.base_url, LADDER + sweep + server)
        target = cli("status", "--json").json["target"]
        batch_two = {"last_passing": {"batch_size": 2, "concurrency": 2}}
        Ledger(isolated / "runs").append(
            LedgerEntry("ladder", "ladder-b2", target, True, batch_two)
        )
        context = cli("ladder", "--axis", "context", "--context-lengths", "512,3000", "--json")
        assert context.code == 0, context.err
        status = cli("status", "--json")
        sweep_gate = cli("sweep", "--json")
        pin = cli("pin", "--kind", "vllm", "--json")
    assert status.json["setting"]["batch_size"] == 2  # the batch-axis ladder's, not 1
    verified = status.json["verified_input_tokens"]
    assert abs(verified - 3000) <= 150
    # the batch ladder still opens the sweep gate, at its batch size (passed, or not on a busy
    # machine: either way it ran)
    assert sweep_gate.code in (0, 1), sweep_gate.err
    assert sweep_gate.json["batch_size"] == 2
    assert pin.code == 0, pin.err
    header = (isolated / "scripts/launch.sh").read_text("utf-8")
    workload_line = next(line for line in header.splitlines() if line.startswith("# workload:"))
    assert f"inputs verified up to {verified:,} tokens" in workload_line
    assert "BATCH_SIZE=2" in header


def test_batch_warns_before_sending_about_items_longer_than_any_ladder_verified(
    cli, isolated: Path
) -> None:
    tasks = isolated / "long.jsonl"
    lines = [{"id": i, "text": " ".join(["word"] * (i * 400))} for i in range(1, 9)]
    tasks.write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
    with start_mock(**FAST_MOCK, max_model_len=8192) as mock:
        calibrated(cli, isolated, mock.base_url)
        ladder = cli("ladder", "--axis", "context", "--context-lengths", "512,2000")
        assert ladder.code == 0, ladder.err
        out = str(isolated / "out.jsonl")
        result = cli("batch", "--input", str(tasks), "--out", out, "-c", "2")
    # items of 2,400 … 3,200 words (about a token each) are longer than the 2,000 verified
    warning = next(line for line in result.err.splitlines() if "items exceed" in line)
    found = re.match(r"warning: (\d+) items exceed ([\d,]+) tokens", warning)
    assert found and found[1] == "4", warning
    assert abs(int(found[2].replace(",", "")) - 2000) <= 100  # what the 2000-token step sent
    assert "run calibrate ladder --tasks" in warning and str(tasks) in warning
    assert result.err.index("items exceed") < result.err.index("all 8 items ok")  # before the end
    assert result.code == 0


def test_batch_says_nothing_when_every_item_fits(cli, isolated: Path) -> None:
    tasks = isolated / "short.jsonl"
    tasks.write_text('{"id": 1, "text": "short"}\n{"id": 2, "text": "also short"}\n', "utf-8")
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [1]\n")
        assert cli("ladder", "--input-tokens", "200", "--output-tokens", "10").code == 0
        result = cli("batch", "--input", str(tasks), "--out", str(isolated / "out.jsonl"))
    assert result.code == 0, result.err
    assert "exceed" not in result.err


# llama.cpp with --ctx-size 2048 --parallel 4: 512 tokens a slot; a 320-token prompt leaves
# room for 192 of a 200-token forced answer
SLOT_MOCK: dict[str, Any] = {**FAST_MOCK, "slot_context": 512}
CUT = re.compile(r"cut off at (\d+) of 200 forced tokens: prompt (\d+) \+ 200 exceeds the server's")


def test_a_forced_answer_cut_by_a_full_slot_names_the_context_and_the_numbers(
    cli, isolated: Path
) -> None:
    with start_mock(**SLOT_MOCK, expose_props=True) as mock:
        calibrated(cli, isolated, mock.base_url)
        result = cli("ladder", "--input-tokens", "320", "--output-tokens", "200")
    assert result.code == 1, result.err
    found = CUT.search(result.err)
    assert found, result.err
    got, prompt = int(found[1]), int(found[2])
    assert got + prompt == 512 and abs(prompt - 320) <= 16
    tail = result.err[found.end() :].split("\n", 1)[0]
    assert tail == " per-slot context 512 (llama.cpp: raise --ctx-size or lower --parallel)"


def test_a_cut_that_fits_the_reported_context_is_not_blamed_on_it(cli, isolated: Path) -> None:
    # no /props: the server says only max_model_len 4096, which 320 + 200 fit
    with start_mock(**SLOT_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url)
        result = cli("ladder", "--input-tokens", "320", "--output-tokens", "200")
    assert result.code == 1, result.err
    assert re.search(r"cut off at \d+ of 200 forced tokens \(finish_reason length\)", result.err)
    assert "exceeds" not in result.err and "may exceed" not in result.err


def test_the_cut_message_with_an_unknown_or_a_model_context() -> None:
    cut = Choice(0, "some text", "length")
    unknown = incomplete_reason(
        cut, 200, forced_tokens=200, completion_tokens=195, prompt_tokens=300
    )
    assert unknown == (
        "cut off at 195 of 200 forced tokens (finish_reason length); the answer was forced to "
        "200 tokens: the prompt (300 tokens) plus the answer may exceed the server's context"
    )
    vllm = ContextLimit(480, "context (max_model_len)", MAX_MODEL_LEN_HINT)
    named = incomplete_reason(
        cut, 200, forced_tokens=200, completion_tokens=180, prompt_tokens=300, context=lambda: vllm
    )
    assert named == (
        "cut off at 180 of 200 forced tokens: prompt 300 + 200 exceeds the server's context "
        "(max_model_len) 480 (vLLM: raise --max-model-len)"
    )
    asked: list[int] = []

    def never() -> ContextLimit | None:
        asked.append(1)
        return None

    whole = incomplete_reason(cut, 200, forced_tokens=200, completion_tokens=200, context=never)
    assert whole is None and not asked, "a complete answer never asks the server"


def test_the_per_slot_context_is_read_from_any_shape_of_props() -> None:
    assert props_context({"default_generation_settings": {"n_ctx": 512}, "total_slots": 4}) == 512
    assert props_context({"n_ctx": 2048, "total_slots": 4}) == 512  # shared by the slots
    assert props_context({"n_ctx": 2048}) == 2048
    assert props_context({"default_generation_settings": {"n_ctx": "512"}}) is None
    assert props_context(["not", "props"]) is None
    for absurd in (10**330, -512, 0, True):  # no context, not a limit every prompt is under
        assert props_context({"default_generation_settings": {"n_ctx": absurd}}) is None
        assert props_context({"n_ctx": absurd, "total_slots": 1}) is None


def _length_tier(length: int, verdict: str) -> Tier:
    stats = replace(CLEAN, batch_size=1, input_tokens_target=float(length))
    reason = relabel(f"batch 1: {verdict}", 1, length)  # as the ladder says it
    return Tier(stats, (stats,), verdict, reason, 2)  # type: ignore[arg-type]


def _walk(limit: int, planned: tuple[int, ...], cut: int | None = None) -> list[Tier]:
    """The axis against a server that takes inputs up to ``limit`` tokens; ``cut`` tiers in,
    the run is interrupted."""
    history: list[Tier] = []
    while (length := next_length(history, planned)) is not None and len(history) != cut:
        history.append(_length_tier(length, "pass" if length <= limit else "fail"))
        assert len(history) < 40, "the bisection ends"
    return history


PLANNED = (512, 1024, 2048, 4096, 8192, 16384)


def test_the_bisection_ends_within_5_percent_or_256_tokens_of_any_limit() -> None:
    for limit in (600, 1100, 4872, 5000, 8191, 12000, 16000):
        history = _walk(limit, PLANNED)
        low, high = bracket(history) or (0, 0)
        assert low <= limit < high, (limit, low, high)
        assert high - low <= max(0.05 * low, 256), (limit, low, high)
        assert axis_stopped_by(history, PLANNED) == "failure"
        assert len(history) <= len(PLANNED) + 7, (limit, len(history))  # log2 steps
        line = outcome(history, low, 1)
        assert line.startswith(f"longest passing input: {low:,} tokens (input lengths {low:,}")
        assert "batch 1" not in line


def test_the_axis_without_a_failure_or_failing_at_once_does_not_bisect() -> None:
    everything = _walk(10**6, PLANNED)
    assert [tier_length(t) for t in everything] == list(PLANNED)
    assert axis_stopped_by(everything, PLANNED) == "completed"
    assert outcome(everything, 16384, 1).endswith("(every input length passed)")
    nothing = _walk(100, PLANNED)
    assert [t.verdict for t in nothing] == ["fail"]
    assert axis_stopped_by(nothing, PLANNED) == "failure"


def test_an_interrupted_bisection_or_another_stop_ends_the_axis_as_it_should() -> None:
    assert axis_stopped_by(_walk(4872, PLANNED, cut=6), PLANNED) == "interrupted"
    history = _walk(4872, PLANNED, cut=6)
    history.append(_length_tier(next_length(history, PLANNED) or 0, "stop: vram"))
    assert next_length(history, PLANNED) is None  # memory is full: no longer input after it
    assert axis_stopped_by(history, PLANNED) == "vram"


def test_a_reason_is_said_of_the_input_length() -> None:
    assert relabel("batch 1: 2 of 2 requests failed (oom×2)", 1, 4864.0) == (
        "input 4,864 tokens: 2 of 2 requests failed (oom×2)"
    )
    assert (
        relabel("batch 2: 4 requests clean", 2, 512)
        == "input 512 tokens at batch 2: 4 requests clean"
    )
    assert relabel("batch 1: clean", 1, None) == "batch 1: clean"  # nothing sized: as it was
