"""A slow server (a CPU build, a big model offloaded): answers take seconds, waves queue behind
few slots. What calibrate says must name the setting to raise, and to what; its figures must not
round a slow server down to nothing. Fast mock settings show the same rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from calibrate.numbers import rate_text
from calibrate.stages.ladder.timeouts import timeout_advice
from calibrate.stages.measure.tier import Tier
from calibrate.stages.measure.tiers import Stats
from tests.batch_helpers import write_tasks
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, assert_ladder_ran, jsonl, open_gate


def test_a_tier_cut_at_the_clients_timeout_names_timeout_s_and_a_value_that_fits(
    cli: Any, isolated: Path
) -> None:
    # one slot, ≈0.35 s an answer: a wave of 4 waits in the server's queue and its last answers
    # come after ≈1.4 s, past a timeout_s of 0.8 s — calibrate's limit, not the server's error.
    # What the ladder makes of batch 1 is not the subject: beside CPU burners the client may be
    # the limit there (exit 1, said so), and its slowest answer, which the advice scales, is
    # slower than 0.35 s — the value advised is checked against the run's own measurement
    with start_mock(ttft_s=0.2, per_token_s=0.003, slots=1) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 4]\n")
        toml = isolated / "calibrate.toml"
        toml.write_text(toml.read_text("utf-8").replace("timeout_s = 30", "timeout_s = 0.8"))
        result = cli("ladder")
    assert_ladder_ran(result)  # batch 1 passed, or the client was the limit (said so)
    said = result.err
    assert "[target] timeout_s = 0.8 s" in said, said
    assert "not by an error of the server" in said, said
    # 4 × batch 1's slowest answer (≈0.35 s, more on a busy machine) ≈ 1.4 s; twice that, as a
    # number to write down (two significant digits, rounded up)
    (run,) = (isolated / "runs").glob("*-ladder-*")
    first = next(t for t in jsonl(run / "tiers.jsonl") if t["batch_size"] == 1)
    needed = 4 * first["latency_max_s"]
    advised = re.search(r"set timeout_s = ([0-9.]+) in calibrate.toml's \[target\]", said)
    assert advised is not None, said
    assert 2.0 <= 2 * needed <= float(advised.group(1)) <= 2 * needed + 1, (needed, said)


SLOW_TOKEN = {"ttft_s": 2.2, "per_token_s": 0.0, "answer_tokens": 1}  # 0.45 output tokens/s


def test_a_slow_batchs_output_tokens_per_s_is_not_rounded_down_to_zero(
    cli: Any, isolated: Path
) -> None:
    # one token in ≈2.2 s: 0.45 output tokens/s, which "{:.0f}" wrote as "0 output tokens/s",
    # as if nothing came back
    with start_mock(**SLOW_TOKEN) as mock:
        open_gate(isolated, mock.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 1)
        batch = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "-c", "1")
    assert batch.code == 0, batch.err
    tokens = re.search(r"([0-9.]+) output tokens/s", batch.err)
    assert tokens is not None, batch.err
    assert 0.3 <= float(tokens.group(1)) <= 0.5, batch.err


def test_a_slow_tiers_tok_s_cell_is_not_rounded_down_to_zero(cli: Any, isolated: Path) -> None:
    # the ladder's tok/s column ("{:.0f}") read "0" for the same server
    with start_mock(**SLOW_TOKEN) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1]\nrounds = 1\n")
        ladder = cli("ladder", "--wide")
    assert ladder.code == 0, ladder.err
    lines = ladder.err.splitlines()
    at = next(n for n, line in enumerate(lines) if " tok/s " in line)  # --wide: every column
    header, row = lines[at], lines[at + 1]
    end = header.index(" tok/s ") + len(" tok/s")  # the column is right-aligned
    assert 0.3 <= float(row[:end].split()[-1]) <= 0.5, ladder.err


@pytest.mark.parametrize(
    ("value", "fmt", "shown"),
    [
        (0.0041, ".2f", "0.0041"),  # a slow server's rate: slow, not stopped
        (0.45, ".0f", "0.45"),
        (0.0, ".1f", "0.0"),  # none at all stays zero
        (12.34, ".1f", "12.3"),  # an ordinary rate as it always read
        (1234.5, ",.1f", "1,234.5"),  # a thousands separator (a ValueError before)
        (3e-05, ".2g", "3e-05"),
    ],
)
def test_a_rate_is_never_rounded_to_zero_and_never_breaks_on_its_format(
    value: float, fmt: str, shown: str
) -> None:
    assert rate_text(value, fmt) == shown


def _tier(batch: int, verdict: str, latency_max_s: float, timeouts: int = 0) -> Tier:
    fields: dict[str, object] = {
        "batch_size": batch, "concurrency": batch, "round": None, "items": batch, "waves": 1,
        "total_s": 1.0, "per_item_s": 1.0 / batch, "latency_mean_s": 1.0, "latency_p50_s": 1.0,
        "latency_p90_s": 1.0, "latency_p99_s": 1.0, "latency_max_s": latency_max_s,
        "ttft_p50_s": None, "ttft_p99_s": None, "tpot_p50_s": None, "tpot_p99_s": None,
        "items_per_s": 4.0, "output_tokens_per_s": 40.0, "peak_vram_mib": None,
        "vram_idle_mib": None, "vram_total_mib": None, "pressure": None,
        "pressure_source": "none", "peak_kv_usage": None, "errors": timeouts,
        "error_kinds": {"timeout": timeouts} if timeouts else {}, "first_done_s": 0.5,
        "last_done_s": 1.0, "baseline_match": None, "baseline_items": 0,
    }  # fmt: skip
    stats = Stats(**fields)  # type: ignore[arg-type]
    return Tier(stats, (stats,), verdict, "", 2)  # type: ignore[arg-type]


def test_timeout_advice_never_says_a_wave_needs_less_than_the_limit_it_hit() -> None:
    """Batch 1's slowest answer 0.4 s; batch 4's requests hit a 30 s timeout_s: "4 × 0.4 s" can
    not explain it. It said "a wave of 4 needs about 2 s here; set timeout_s = 60" — now that the
    wave took longer than that, the estimate being below it; and sub-second figures keep digits."""
    tiers = [_tier(1, "pass", 0.4), _tier(4, "fail", 30.0, timeouts=3)]
    said = timeout_advice(tiers, 30.0)
    assert said is not None
    assert "needs about" not in said and "took longer than that here" in said, said
    assert "puts it at about 1.6 s" in said and "slowest answer, 0.4 s" in said, said
    assert "set timeout_s = 60 " in said, said
    fits = timeout_advice([_tier(1, "pass", 0.38), _tier(4, "fail", 1.0, timeouts=2)], 0.8)
    assert fits is not None and "needs about 1.5 s here" in fits, fits
