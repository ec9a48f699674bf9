"""SLOs and goodput (SPEC §5.13): one definition for the ladder, the sweep and tune; the sweep's
recommendation by goodput names the SLO that bound it."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from calibrate.config import Config, SloConfig, SweepConfig
from calibrate.errors import UsageError
from calibrate.gpu.vram import VramMonitor
from calibrate.http.models import Choice, Completion, Usage
from calibrate.io.tier_table import read_table
from calibrate.load.answers import answer_items
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.stages.measure.slo import goodput, item_met, misses, parse_slo_flags
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.mockserver import start_mock
from tests.report_helpers import Page, table_lines
from tests.stage_fakes import SimulatedLoop, close_runs, recorder, stage_ctx
from tests.tier_helpers import FAST, jsonl, open_gate, run_dir

__all__ = ["close_runs"]


def _item(ttft_s: float, elapsed_s: float, tokens: int, ok: bool = True) -> ItemResult:
    request = Request("/chat/completions", {}, ("p",), 1)
    completion = Completion(
        (Choice(0, "text", "stop" if ok else None),),
        Usage(5, tokens, 5 + tokens),
        "m",
        None,
        elapsed_s,
        ttft_s,
    )
    return answer_items(request, completion, 0.0, elapsed_s, None)[0]


def test_goodput_counts_the_requests_that_met_every_slo() -> None:
    """10 requests over 2 s; TTFT 0.5 s and TPOT 0.05 s bounds: the right 4 count."""
    slo = SloConfig(ttft_p99_s=0.5, tpot_p99_s=0.05)
    items = [
        _item(0.2, 0.2 + 0.04 * 9, 10),  # met both
        _item(0.5, 0.5 + 0.05 * 9, 10),  # exactly at both bounds: met
        _item(0.1, 0.1 + 0.01 * 9, 10),  # met
        _item(0.3, 0.3, 1),  # one token: no TPOT to miss, TTFT met
        _item(0.6, 0.6 + 0.01 * 9, 10),  # TTFT over
        _item(0.1, 0.1 + 0.06 * 9, 10),  # TPOT over
        _item(0.9, 0.9 + 0.09 * 9, 10),  # both over
        _item(0.1, 0.2, 10, ok=False),  # failed (incomplete): never goodput
        *[replace(_item(0.1, 0.2, 10), ttft_s=None)] * 2,  # not streamed: TTFT cannot be met
    ]
    good = goodput(slo, items, 2.0)
    assert good.met == 4 and good.per_s == pytest.approx(2.0)
    assert [item_met(slo, i) for i in items[:4]] == [True] * 4
    only_e2e = SloConfig(e2e_p99_s=0.5)
    assert goodput(only_e2e, items, 2.0).met == 4  # answered within 0.5 s (unstreamed too)


def record_met(slo: SloConfig, record: dict[str, Any]) -> bool:
    """The goodput judgement made again on a request record read back from records.jsonl."""
    if record.get("ok") is not True:
        return False
    tokens = (record.get("usage") or {}).get("completion_tokens")
    return not misses(slo, e2e_s=record["elapsed_s"], ttft_s=record.get("ttft_s"), tokens=tokens)


def test_slo_flags_override_the_config_and_bad_ones_say_the_form() -> None:
    slo = parse_slo_flags(["ttft:0.5", "tpot:0.05 e2e:20"], SloConfig(ttft_p99_s=1.0))
    assert slo == SloConfig(0.5, 0.05, 20.0)
    assert parse_slo_flags([], SloConfig(e2e_p99_s=3.0)) == SloConfig(e2e_p99_s=3.0)
    with pytest.raises(UsageError, match="NAME:SECONDS"):
        parse_slo_flags(["latency:0.5"], SloConfig())


def test_the_recommendation_by_goodput_names_the_binding_slo(tmp_path: Path) -> None:
    """4 slots, 0.1 s a request: at 8 in flight each waits for a slot (0.2 s), over an E2E SLO
    of 0.15 s — goodput is highest at 4, and the E2E bound is what stops it."""
    cfg = Config(sweep=replace(SweepConfig(), concurrency=(1, 2, 4, 8), level_s=1.0, repeats=3))
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    options = replace(SweepOptions.from_config(cfg, 4), slo=SloConfig(e2e_p99_s=0.15))
    sweep = Sweep(
        ctx, options, monitor, recorder(ctx, monitor, tmp_path), SimulatedLoop(lambda c, r: 0.1)
    )
    result = sweep.run()
    goodputs = [round(lv.stats.goodput_per_s or 0.0, 6) for lv in result.levels]
    assert goodputs == [10.0, 20.0, 40.0, 0.0]
    assert result.best is not None and result.best.concurrency == 4
    assert result.recommendation.startswith("concurrency 4: goodput 40.00 req/s within the SLOs")
    assert "bounded by e2e p99 0.15 s" in result.recommendation
    summary = result.summary(options).to_json()
    assert summary["recommended_concurrency"] == 4 and summary["slo"] == "e2e p99 ≤ 0.15 s"
    assert result.levels[2].to_json()["goodput_per_s_min"] == pytest.approx(40.0)


def test_the_knee_of_goodput_is_said_in_goodput(tmp_path: Path) -> None:
    """Under SLOs the knee is judged on goodput: at 8 in flight the throughput holds (40
    items/s, the slots' limit) while no request meets the E2E SLO — the knee's words say the
    goodput fell, never that the throughput did (it read "8 adds −100 % over 4: throughput
    fell" beside a table of 40 and 40 items/s)."""
    cfg = Config(sweep=replace(SweepConfig(), concurrency=(1, 2, 4, 8), level_s=1.0, repeats=3))
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    options = replace(SweepOptions.from_config(cfg, 4), slo=SloConfig(e2e_p99_s=0.15))
    sweep = Sweep(
        ctx, options, monitor, recorder(ctx, monitor, tmp_path), SimulatedLoop(lambda c, r: 0.1)
    )
    result = sweep.run()
    assert [round(lv.stats.items_per_s, 6) for lv in result.levels][2:] == [40.0, 40.0]
    assert "8 adds −100 % over 4, range −100 %…−100 %: goodput fell" in result.knee_text
    assert "throughput" not in result.knee_text, result.knee_text


def test_a_goodput_recommendation_says_how_sure_it_is(cli, isolated: Path) -> None:
    """SPEC §5.6: the recommendation says how sure it is — under SLOs too. With one run a level
    the JSON's knee said "— not sure" while the text said only "recommended concurrency 2:
    goodput … req/s within the SLOs (median)", as sure as a knee of three runs."""
    sweep = FAST + "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 1\n"
    with start_mock(ttft_s=0.004, per_token_s=0.0005, slots=4) as mock:
        open_gate(isolated, mock.base_url, sweep, stage="ladder")
        result = cli("sweep", "--json", "--slo", "e2e:30")
    assert result.code == 0, result.err
    knee = result.json["knee"]
    assert knee is not None and knee["how_sure"].endswith("— not sure"), knee
    assert "one run per level" in knee["how_sure"]
    assert f"how sure: {knee['how_sure']}" in result.err


def test_ladder_tiers_carry_goodput_where_queueing_makes_half_a_wave_miss(
    cli, isolated: Path
) -> None:
    """2 slots, ~0.2 s a request: at batch 4 two of each wave wait for a slot (TTFT ≈ 0.2 s),
    over ``--slo ttft:0.08 e2e:0.3``, so tier 4 stops there. Over real HTTP what holds however
    busy the machine: goodput is over the window items/s uses (the tier's and each round's
    total_s), the records judged again give each tier's count, and the ledger says the same.
    The exact counts (half of tier 4) are on the simulated server:
    tests/stages/ladder/test_goodput.py."""
    config = FAST + "batch_sizes = [1, 2, 4]\n"
    with start_mock(ttft_s=0.01, per_token_s=0.004, slots=2) as mock:
        open_gate(isolated, mock.base_url, config)
        result = cli("ladder", "--json", "--slo", "ttft:0.08", "e2e:0.3")
        plain = cli("ladder", "--json")
    out = result.json
    detail = out["tiers_detail"]
    assert out["tiers"][-1]["verdict"] == "stop: slo", result.err
    assert detail[-1]["slo_met"] < detail[-1]["items"]  # at batch 4: those waiting miss
    # beside two CPU burners batch 1's TTFT p99 read 0.44 s: the SLO stopped the first tier and
    # nothing passed (exit 1, said as such); the goodput's window and counts hold all the same
    assert result.code == (0 if len(detail) > 1 else 1), result.err
    if len(detail) > 1 and detail[-1]["client_bound"]:
        # a stop timed by a starved client is no boundary; FAST takes the tier below, said so
        assert "the conservative answer, taken" in result.json["setting_reason"], result.err
    for tier in detail:
        assert tier["goodput_per_s"] == pytest.approx(tier["slo_met"] / tier["total_s"], rel=1e-4)
        assert tier["goodput_per_s"] <= tier["items_per_s"] * (1 + 1e-4)
    run = run_dir(isolated, out["run_id"])
    slo = SloConfig(ttft_p99_s=0.08, e2e_p99_s=0.3)
    records = jsonl(run / "records.jsonl")
    for tier in detail:  # the same judgement as each request record read back
        mine = [r for r in records if r["batch_size"] == tier["batch_size"]]
        assert sum(record_met(slo, r) for r in mine) == tier["slo_met"]
    rounds = jsonl(run / "rounds.jsonl")
    assert all(
        r["goodput_per_s"] == pytest.approx(r["slo_met"] / r["total_s"], rel=1e-4) for r in rounds
    )
    if result.code == 1:
        assert "is over the SLO" in result.err and out["last_passing"] is None
        return
    # the ledger's summary: the SLOs and the last passing tier's goodput
    chosen = next(t for t in detail if t["batch_size"] == out["last_passing"]["batch_size"])
    assert out["slo"] == "ttft p99 ≤ 0.08 s, e2e p99 ≤ 0.3 s"
    assert out["slo_met"] == chosen["slo_met"]
    assert out["goodput_per_s"] == pytest.approx(chosen["goodput_per_s"], abs=1e-4)
    assert [t["goodput_per_s"] for t in out["tiers"]] == [
        pytest.approx(t["goodput_per_s"], abs=1e-4) for t in detail
    ]
    assert jsonl(isolated / "runs/ledger.jsonl")[-2]["summary"]["slo_met"] == chosen["slo_met"]
    header, *rows = table_lines(result.err)  # the log's table: a row per tier, goodput in each
    at = header.index("goodput") + len("goodput")
    assert len(rows) == len(detail) and all(re.search(r"\d+\.\d\d$", r[:at]) for r in rows), rows
    batch = chosen["batch_size"]
    setting = next(
        ln for ln in result.err.splitlines() if ln.startswith(f"setting: batch {batch}, ")
    )
    assert (
        "concurrency 1 (no sweep at this batch size yet), goodput " in setting
        and "the last passing tier" in setting
    )
    table = read_table(run / "tiers.csv").rows
    assert [r.slo_met for r in table] == [t["slo_met"] for t in detail]
    assert [round(r.goodput_per_s or 0.0, 4) for r in table] == [
        round(t["goodput_per_s"], 4) for t in detail
    ]
    shown = cli("report", str(run), "--html", "--no-plot")
    assert shown.code == 0, shown.err
    header = next(line for line in shown.err.splitlines() if "verdict" in line)
    assert "goodput" in header
    page = Page((run / "report.html").read_text("utf-8"))
    columns = page.rows["tiers"][0]
    good = [r[columns.index("goodput")] for r in page.body_rows("tiers")]
    assert good == [f"{t['goodput_per_s']:.2f}" for t in detail]
    assert [r[columns.index("slo_met")] for r in page.body_rows("tiers")] == [
        str(t["slo_met"]) for t in detail
    ]
    # without SLOs: no goodput anywhere
    assert plain.code == 0, plain.err
    assert all(
        t["goodput_per_s"] is None and t["slo_met"] is None for t in plain.json["tiers_detail"]
    )
    assert "goodput_per_s" not in plain.json and "slo" not in plain.json
    assert all("goodput_per_s" not in t for t in plain.json["tiers"])
    assert "goodput" not in plain.err
