"""Ladder logic in milliseconds: a scripted sender and a fake VRAM source, no HTTP.

The stop rules run at their real defaults here (the end-to-end tests over HTTP keep the latency
rule out of the way because ms-scale timings jitter on a loaded machine; these do not jitter).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calibrate.config import Config, LadderConfig, SloConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.run import Ladder
from tests.stage_fakes import FakeKv, Script, ScriptedSender, close_runs, recorder, stage_ctx
from tests.tier_helpers import jsonl

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

# the tests' own windows: one wave per round and no warm-up unless a test asks for them
ONE_WAVE = {"min_round_s": 0.0, "warmup_waves": 0}


def _ladder(
    tmp_path: Path,
    script: Script,
    kv: FakeKv | None = None,
    slo: SloConfig | None = None,
    **ladder: object,
) -> Ladder:
    settings = {**ONE_WAVE, "batch_sizes": (1, 2, 4, 8), **ladder}
    cfg = Config(
        ladder=replace(LadderConfig(), **settings),  # type: ignore[arg-type]
        slo=slo or SloConfig(),
    )
    ctx = stage_ctx(tmp_path, cfg, "ladder")
    monitor = VramMonitor([kv] if kv else [])
    return Ladder(
        ctx,
        LadderOptions.from_config(cfg),
        monitor,
        recorder(ctx, monitor, tmp_path),
        ScriptedSender(script),
    )


def _per_item(per_item_s: dict[int, float]) -> Script:
    """Waves whose wall time makes each item cost ``per_item_s[batch]``; latency = the wave."""
    return lambda batch, n: (per_item_s[batch] * batch, per_item_s[batch] * batch, None)


def test_flat_time_per_item_passes_every_tier(tmp_path: Path) -> None:
    result = _ladder(tmp_path, _per_item({1: 0.1, 2: 0.1, 4: 0.1, 8: 0.1})).run()
    assert [t.verdict for t in result.tiers] == ["pass"] * 4
    assert result.stopped_by == "completed" and result.last_passing is not None
    assert result.summary().max_in_flight == 8


def test_request_latency_rising_with_the_batch_is_not_a_stop(tmp_path: Path) -> None:
    """The llama.cpp case: a wave of 8 takes 4× as long as a wave of 1 (request latency ×4),
    but 8 items came out, so each cost half as much: batching works."""
    walls = {1: 0.007, 2: 0.009, 4: 0.014, 8: 0.028}
    result = _ladder(tmp_path, lambda batch, n: (walls[batch], walls[batch], None)).run()
    assert result.stopped_by == "completed"
    per_item = [t.stats.per_item_s for t in result.tiers]
    assert per_item == [0.007, 0.0045, 0.0035, 0.0035]


def test_latency_rule_at_its_default_stops_and_keeps_the_tier(tmp_path: Path) -> None:
    default = LadderConfig().latency_rise
    assert default == 1.25
    ladder = _ladder(tmp_path, _per_item({1: 0.1, 2: 0.1, 4: 0.1, 8: 0.1 * (default + 0.05)}))
    result = ladder.run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass", "pass", "stop: latency"]
    assert result.stopped_by == "latency"
    assert result.last_passing is not None and result.last_passing.batch_size == 8
    assert "batch 8: 0.13 s per item is 1.30× batch 4's 0.1 s (limit 1.25×)" in (
        result.tiers[-1].reason
    )


def test_a_rise_just_under_the_default_is_not_a_stop(tmp_path: Path) -> None:
    default = LadderConfig().latency_rise
    result = _ladder(tmp_path, _per_item({1: 0.1, 2: 0.1, 4: 0.1, 8: 0.1 * (default - 0.01)}))
    assert result.run().stopped_by == "completed"


def test_a_round_repeats_waves_until_min_round_s(tmp_path: Path) -> None:
    """Waves of 0.1 s and a 0.35 s window: 4 waves a round (0.4 s), items and time per item
    from all of them; the warm-up wave goes first and counts nowhere."""
    ladder = _ladder(
        tmp_path,
        lambda batch, n: (0.1, 0.1, None),
        min_round_s=0.35,
        warmup_waves=1,
        batch_sizes=(2, 4),
    )
    result = ladder.run()
    sender = ladder.sender
    assert isinstance(sender, ScriptedSender)
    assert sender.calls == [(2, 2)] + [(2, 2)] * 8 + [(4, 4)] * 8, "warm-up, then 4 waves a round"
    first = result.tiers[0]
    assert [(r.waves, r.items) for r in first.rounds] == [(4, 8), (4, 8)]
    assert first.rounds[0].total_s == 0.4 and first.rounds[0].per_item_s == 0.05
    assert first.stats.waves == 8 and first.stats.items == 16 and first.stats.per_item_s == 0.05
    assert result.tiers[1].stats.per_item_s == 0.025
    assert result.warmup is not None and (result.warmup.waves, result.warmup.items) == (1, 2)
    assert result.summary().details["warmup"]["items"] == 2
    records = jsonl(ladder.ctx.run.path / "records.jsonl")
    assert len(records) == 16 + 32, "the warm-up is not recorded"
    # item numbers run on across a round's waves, and times are from the round's start
    round_one = [r for r in records if r["batch_size"] == 2 and r["round"] == 1]
    assert len(round_one) == 8 and first.rounds[0].last_done_s == 0.4


def test_min_round_s_zero_is_one_wave(tmp_path: Path) -> None:
    ladder = _ladder(tmp_path, lambda batch, n: (0.1, 0.1, None))
    ladder.run()
    sender = ladder.sender
    assert isinstance(sender, ScriptedSender)
    assert sender.calls == [(b, b) for b in (1, 2, 4, 8) for _ in range(2)]


def test_a_failing_wave_ends_its_round_and_the_tier(tmp_path: Path) -> None:
    ladder = _ladder(
        tmp_path, lambda batch, n: (0.1, 0.1, "oom" if batch == 8 else None), min_round_s=0.25
    )
    result = ladder.run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass", "pass", "fail"]
    assert result.last_passing is not None and result.last_passing.batch_size == 4
    assert result.summary().max_in_flight == 4
    failed = result.tiers[-1]
    assert len(failed.rounds) == 1 and failed.rounds[0].waves == 1, "no more waves after a failure"
    assert len(list((ladder.ctx.run.path / "incidents").glob("8-1-*.json"))) == 8


def test_vram_pressure_at_the_limit_stops_above_the_tier(tmp_path: Path) -> None:
    kv = FakeKv()

    def script(batch: int, n: int) -> tuple[float, float, None]:
        kv.usage = {1: 0.2, 2: 0.4, 4: 0.95, 8: 0.99}[batch]
        return 0.1, 0.1, None

    result = _ladder(tmp_path, script, kv).run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass", "stop: vram"]
    assert result.last_passing is not None and result.last_passing.batch_size == 4


def test_an_e2e_slo_stops_the_ladder_and_keeps_the_tier_before(tmp_path: Path) -> None:
    """Request latency 0.1 s × batch against an E2E bound of 0.25 s: batch 4 breaks it."""
    script: Script = lambda batch, n: (0.1 * batch, 0.1 * batch, None)  # noqa: E731
    ladder = _ladder(tmp_path, script, slo=SloConfig(e2e_p99_s=0.25))
    result = ladder.run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass", "stop: slo"]
    assert result.stopped_by == "slo"
    assert result.last_passing is not None and result.last_passing.batch_size == 2
    assert result.summary().max_in_flight == 2
    assert "E2E latency p99 0.4 s is over the SLO 0.25 s" in result.tiers[-1].reason
    sender = ladder.sender
    assert isinstance(sender, ScriptedSender)
    assert all(b.get("stream") for b in sender.bodies), "streamed by default (SPEC §5.13)"


def test_a_ttft_slo_streams_the_requests_and_reads_ttft(tmp_path: Path) -> None:
    script: Script = lambda batch, n: (0.4 * batch, 0.4 * batch, None)  # noqa: E731
    ladder = _ladder(tmp_path, script, slo=SloConfig(ttft_p99_s=0.15))
    result = ladder.run()
    sender = ladder.sender
    assert isinstance(sender, ScriptedSender)
    assert sender.bodies and all(b.get("stream") is True for b in sender.bodies)
    assert [t.verdict for t in result.tiers] == ["pass", "stop: slo"]
    first, second = (t.stats for t in result.tiers)
    assert first.ttft_p99_s == 0.1 and second.ttft_p99_s == 0.2
    # TPOT = (E2E − TTFT) / (tokens − 1): (0.4 − 0.1) / 4
    assert first.tpot_p50_s is not None and abs(first.tpot_p50_s - 0.075) < 1e-9
    assert "batch 2: TTFT p99 0.2 s is over the SLO 0.15 s" in result.tiers[-1].reason
    assert result.last_passing is not None and result.last_passing.batch_size == 1
