"""The workload's pure parts, in milliseconds: sizes, the token probe's fit, the forced-length
rule, the [workload] section and the metric names the VRAM sampler reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calibrate import config
from calibrate.errors import ConfigError, ErrorInfo, RequestError, UsageError
from calibrate.gpu.engine_metrics import reading_from_metrics
from calibrate.gpu.prometheus import parse_prometheus
from calibrate.gpu.reading import choose_pressure
from calibrate.http.models import Choice, incomplete_reason
from calibrate.stages.ladder.context_axis import default_context_lengths
from calibrate.stages.prepare.synthetic import synthetic_prompt
from calibrate.stages.prepare.token_probe import calibrate_tokens, forcing_fields, forcing_for
from calibrate.workload import parse_token_range


def test_token_ranges_and_their_bounds() -> None:
    assert parse_token_range("2000", "--input-tokens").describe() == "2000"
    wide = parse_token_range("512:4096", "--input-tokens")
    assert (wide.low, wide.high, wide.mean) == (512, 4096, 2304)
    for bad in ("0", "x", "4096:512", "1:2000000", ""):
        with pytest.raises(UsageError):
            parse_token_range(bad, "--input-tokens")


def test_default_context_lengths_stop_where_the_answer_still_fits() -> None:
    assert default_context_lengths(8192, 128) == (512, 1024, 2048, 4096, 7654)
    assert default_context_lengths(4096, 128) == (512, 1024, 2048, 3763)
    unknown = default_context_lengths(None, 128)
    assert unknown[:3] == (512, 1024, 2048) and unknown[-1] == 1_048_576
    assert default_context_lengths(600, 128) == (442,)
    assert default_context_lengths(130, 128) == ()  # no room at all: the command says so


class FakeServer:
    """prompt_tokens = 30-token chat template + 1.3 tokens per word; may refuse forcing fields."""

    def __init__(self, refuse_forcing: bool = False) -> None:
        self.sent: list[tuple[int, dict[str, Any]]] = []
        self.refuse_forcing = refuse_forcing

    def __call__(self, words: int, extra: dict[str, Any]) -> int:
        self.sent.append((words, extra))
        if self.refuse_forcing and "ignore_eos" in extra:
            raise RequestError(ErrorInfo("http_4xx", "HTTP 422: extra fields not permitted", 422))
        return round(30 + 1.3 * words)


def test_one_probe_when_close_a_second_fits_the_line_when_far_off() -> None:
    close = FakeServer()
    assert len(calibrate_tokens(close, 100, "full").probes) == 2  # 100 words are 160 tokens
    far = FakeServer()
    fit = calibrate_tokens(far, 3000, "full")
    assert len(far.sent) == 2 and far.sent[0][1]["ignore_eos"] is True
    words = fit.tokens.words_for(3000)
    assert abs(30 + 1.3 * words - 3000) <= 2  # on target once the template's overhead is known
    assert abs(30 + 1.3 * fit.tokens.words_for(512) - 512) <= 2


def test_an_engine_refusing_the_forcing_fields_is_measured_uncontrolled() -> None:
    server = FakeServer(refuse_forcing=True)
    fit = calibrate_tokens(server, 1000, "full")
    assert fit.forcing == "none" and server.sent[-1][1] == {}
    assert forcing_fields("none", 200) == {"max_tokens": 200}


def test_what_each_engine_is_asked_to_force() -> None:
    full = {"max_tokens": 200, "ignore_eos": True, "min_tokens": 200}
    assert forcing_fields(forcing_for("vllm"), 200) == full
    assert forcing_fields(forcing_for(None), 200)["min_tokens"] == 200  # the mock, unknown
    assert forcing_fields(forcing_for("llamacpp"), 200) == {"max_tokens": 200, "ignore_eos": True}
    assert forcing_for("ollama") == forcing_for("tgi") == "none"


def test_a_forced_answer_at_its_length_is_complete_and_nowhere_else() -> None:
    cut = Choice(0, "some text", "length")
    assert incomplete_reason(cut, 200, forced_tokens=200, completion_tokens=200) is None
    short = incomplete_reason(cut, 200, forced_tokens=200, completion_tokens=150)
    assert short is not None and "forced to 200 tokens" in short
    assert incomplete_reason(cut, 128) is not None  # unforced (the canary): the normal rule
    assert incomplete_reason(Choice(0, "", "length"), 5, forced_tokens=5, completion_tokens=5)


def test_synthetic_prompts_unique_unless_shared() -> None:
    a, b = (synthetic_prompt(200, key, seed=0) for key in (1, 2))
    assert len(a.split()) == len(b.split()) == 200 and a.split()[0] != b.split()[0]
    same = {synthetic_prompt(200, key, seed=0, shared=1.0) for key in range(5)}
    assert len(same) == 1
    half = [synthetic_prompt(200, key, seed=0, shared=0.5).split() for key in (1, 2)]
    assert half[0][:100] == half[1][:100] and half[0][100:] != half[1][100:]
    assert synthetic_prompt(200, 1, seed=0) == a  # seeded: the same again


def test_workload_section_is_checked_like_every_other(tmp_path: Path) -> None:
    path = tmp_path / "calibrate.toml"
    good = '[workload]\ninput_tokens = "512:4096"\noutput_tokens = 200\nshared_prefix = 0.25\n'
    path.write_text(good, "utf-8")
    loaded = config.load(config.Overrides(config_path=str(path)), {}).workload
    assert (loaded.input_tokens, loaded.output_tokens, loaded.shared_prefix) == (
        "512:4096",
        200,
        0.25,
    )
    for bad, words in [
        ('source = "files"', "expected one of"),
        ("input_tokens = 0", "input_tokens must be"),
        ("output_tokens = 2000000", "output_tokens must be in"),
        ("shared_prefix = 2", "shared_prefix must be in"),
        ('source = "tasks"', 'needs tasks = "FILE"'),
        ("tokens = 5", "unknown key workload.tokens"),
    ]:
        path.write_text(f"[workload]\n{bad}\n", "utf-8")
        with pytest.raises(ConfigError, match=words):
            config.load(config.Overrides(config_path=str(path)), {})


def test_the_mock_reserving_memory_reads_like_a_preallocating_engine() -> None:
    text = (
        "mock_vram_used_bytes 8.0e10\nmock_vram_total_bytes 8.2e10\n"
        "mock_vram_preallocated 1\nvllm:kv_cache_usage_perc 0.30\n"
    )
    reading = reading_from_metrics(parse_prometheus(text))
    assert reading is not None and reading.preallocated
    pressure = choose_pressure(reading, reading, preallocated=reading.preallocated)
    assert pressure.value == pytest.approx(0.30)  # the KV gauge, not the flat 98 % of memory
    growing = reading_from_metrics(parse_prometheus(text.replace("mock_vram_preallocated 1\n", "")))
    assert growing is not None and not growing.preallocated


def test_newer_sglang_metric_names_are_read() -> None:
    text = 'sglang_token_usage{tp_rank="0"} 0.72\nsglang_token_usage{tp_rank="1"} 0.81\n'
    text += 'sglang_num_queue_reqs{tp_rank="0"} 3\n'
    reading = reading_from_metrics(parse_prometheus(text))
    assert reading is not None
    assert reading.kv_usage == pytest.approx(0.81) and reading.kv_metric == "sglang_token_usage"
    assert reading.server_queue == 3 and reading.queue_metric == "sglang_num_queue_reqs"
