"""``sweep --find-max --rates`` (SPEC §13): the highest offered rate that meets every SLO without
saturating — the pure rate search against a fake probe (exact probes, every boundary on a
1024×-wide range counted), a rate probe's rule (saturated or client-bound is never the
boundary), the range flag, and the real CLI over HTTP end to end (the boundary at a server's
capacity: tests/stages/sweep/test_find_max_rates.py, on the simulated server)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.config import SloConfig
from calibrate.errors import UsageError
from calibrate.stages.measure.tiers import Stats, summarise
from calibrate.stages.sweep.find_max import PRECISION, TOP, Probe, bracket, find_max
from calibrate.stages.sweep.rates import judge_rate, next_rate, parse_rate_range
from tests.mockserver import start_mock_process
from tests.tier_helpers import (
    FAST,
    FOUR_SLOTS,
    PIN_SERVER,
    assert_kept_or_client_bound,
    jsonl,
    open_gate,
)

TTFT = SloConfig(ttft_p99_s=0.1)


def search(passes: Callable[[float], bool], bottom: float, top: float) -> list[Probe]:
    """Run the rate search against a fake probe ``passes(rate)``; the probes in order."""
    history: list[Probe] = []
    while (rate := next_rate(history, bottom, top)) is not None:
        assert all(p.level != rate for p in history), f"{rate} probed twice"
        assert len(history) < 40, "the search does not end"
        ok = passes(rate)
        history.append(Probe(rate, ok, why="" if ok else "saturated: fake"))
    return history


def test_the_rate_bisection_probes_exactly_these_rates() -> None:
    """From 5 req/s, a boundary at 20: ×8 up to 40 (fails), then geometric middles rounded to
    3 digits until the gap is within 5 % of the last passing rate."""
    history = search(lambda r: r <= 20, 5.0, 5120.0)
    assert [p.level for p in history] == [5.0, 40.0, 14.1, 23.7, 18.3, 20.8, 19.5, 20.1]
    assert bracket(history) == (19.5, 20.1)
    result = find_max(history, TTFT, 5120.0, over="rates", bottom=5.0, start="--rates 5:5120")
    assert result.probes == 8 and result.last_passing == 19.5
    assert result.to_json()["boundary_rate"] == 19.5 and result.to_json()["over"] == "rates"
    assert result.text.endswith("8 probes (5, 40, 14.1, 23.7, 18.3, 20.8, 19.5, 20.1)")
    assert result.text.startswith("20.1 req/s broke them: ttft p99 not measured at 20.1 req/s")


def test_every_boundary_on_a_1024x_range_is_found_to_5_percent_in_at_most_10_probes() -> None:
    """SPEC §13's claim over rates, on a fine log grid of boundaries, not one example."""
    bottom, top = 5.0, 5.0 * TOP
    counts: list[int] = []
    for i in range(4000):
        boundary = bottom * math.exp(math.log(TOP) * i / 4000)
        history = search(lambda r, b=boundary: r <= b, bottom, top)
        last, first = bracket(history)
        assert last is not None and first is not None and last <= boundary < first
        assert first - last <= PRECISION * last
        counts.append(len(history))
    assert max(counts) == 10


def test_the_ends_of_the_range() -> None:
    """Every rate passing: ×8 up to the top; the bottom failing: nothing below it is tried."""
    never = search(lambda r: True, 5.0, 5120.0)
    assert [p.level for p in never] == [5.0, 40.0, 320.0, 2560.0, 5120.0]
    result = find_max(never, TTFT, 5120.0, over="rates", bottom=5.0)
    assert "every probe met the SLOs without saturating up to 5120 req/s" in result.text
    bottom = search(lambda r: False, 5.0, 5120.0)
    assert [p.level for p in bottom] == [5.0]
    failed = find_max(bottom, TTFT, 5120.0, over="rates", start="the synchronous rate")
    assert failed.last_passing is None
    assert failed.text.startswith(
        "5 req/s already broke them (the bottom of the search, the synchronous rate): saturated"
    ), failed.text
    assert "no rate was probed" in find_max([], TTFT, over="rates").text


def _run(ttft_p99_s: float) -> Stats:
    stats = summarise(
        batch_size=1, concurrency=4, round_no=1, items=[], total_s=1.0, peaks=[], baseline_text=None
    )
    return replace(stats, ttft_p99_s=ttft_p99_s, items=20)


def test_a_saturated_or_client_bound_rate_is_never_the_boundary() -> None:
    """Within the SLOs but saturated (or not sent at the rate by this process): a failing
    probe, without a cliff (no SLO broke); over an SLO as well: a cliff of that SLO."""
    kept = judge_rate(20.0, [_run(0.02)] * 3, TTFT, "", "")
    assert kept.passed and not kept.missed
    behind = judge_rate(22.0, [_run(0.02)] * 3, TTFT, "achieved 20 req/s is 9% below", "")
    assert not behind.passed and behind.why == "saturated: achieved 20 req/s is 9% below"
    late = judge_rate(22.0, [_run(0.02)], TTFT, "", "calibrate sent only 15 of the offered 22")
    assert not late.passed and late.why.startswith("client-bound: calibrate sent only 15")
    result = find_max([kept, behind], TTFT, 5120.0, over="rates")
    assert (result.last_passing, result.first_failing) == (20.0, 22.0)
    assert result.cliff is None and "22 req/s failed: saturated: achieved" in result.text
    over = judge_rate(22.0, [_run(0.3)] * 3, TTFT, "achieved 18 req/s is 18% below", "")
    assert over.missed and over.why.startswith("ttft p99 0.3 s is over the SLO 0.1 s")
    assert over.why.endswith("; saturated: achieved 18 req/s is 18% below")
    steep = find_max([kept, over], TTFT, 5120.0, over="rates")
    assert steep.cliff is not None and steep.cliff.steep
    assert "22 req/s broke them: median ttft p99 0.02 → 0.3 s from 20 to 22 req/s" in steep.text


def test_the_range_is_auto_or_lo_hi_at_most_1024x_wide() -> None:
    assert parse_rate_range("auto") == (0.0, 0.0)
    assert parse_rate_range("0.5:200") == (0.5, 200.0)
    for bad in ("1,2,4", "8:2", "0:4", "1:inf", "x:3", "2:"):
        with pytest.raises(UsageError, match="give the range to search as LO:HI"):
            parse_rate_range(bad)
    with pytest.raises(UsageError, match=r"at most 1024× wide \(2000× given\)"):
        parse_rate_range("1:2000")


# FOUR_SLOTS: about 4 / 0.2 s = 20 req/s. Sent at a constant rate, no request waits below that
PINNABLE = FAST + "[sweep]\nlevel_s = 0.3\nrepeats = 1\n" + PIN_SERVER


def test_find_max_over_a_given_range_of_rates_end_to_end(cli, isolated: Path) -> None:
    """The real CLI over HTTP, below the 4-slot mock's capacity (~20 req/s): ``--rates 5:8``
    probes 5, then 8 (×8 capped at the top), never outside the range, and names the highest
    probe met as the boundary; pin and status take the most requests in flight there as the
    concurrency, as for a rate sweep. Whether a probe is met is its own measurement: beside two
    CPU-burning processes 8 answers of a 0.3 s probe read "anywhere from 9 % above to 7 % below"
    (not sure it kept up), or the starved mock's TTFT p99 0.515 s broke the 0.5 s SLO, and the
    search went between — each failing probe says why, and a bottom that fails is exit 1. Where
    the boundary lands against a server's capacity is tests/stages/sweep/test_find_max_rates.py's
    claim, on a simulated server and a virtual clock."""
    with start_mock_process(*FOUR_SLOTS) as mock:
        open_gate(isolated, mock.base_url, PINNABLE, stage="ladder")
        result = cli(
            "sweep",
            "--find-max",
            "--rates",
            "5:8",
            "--arrival",
            "constant",
            "--slo",
            "ttft:0.5",
            "--beyond-ladder",
            "--json",
        )
        status = cli("status", "--json")
        pinned = cli("pin", "--json")
    out = result.json
    fm = out["find_max"]
    assert fm["over"] == "rates" and fm["start"] == "--rates 5:8" and fm["bottom"] == 5.0
    order = fm["order"]
    assert order[:2] == [5.0, 8.0][: len(order)], result.err  # the bottom, then the top
    assert all(5.0 <= rate <= 8.0 for rate in order) and fm["probes"] == len(order)
    assert "find-max: synchronous" not in result.err, "a given range needs no synchronous run"
    said = {rate: _probe_line(result.err, n, rate) for n, rate in enumerate(order, 1)}
    met = [rate for rate, line in said.items() if line == "meets the SLOs, not saturated"]
    for line in set(said.values()) - {"meets the SLOs, not saturated"}:
        assert line.startswith(("fails: ", "breaks them: ")) and _HONEST.search(line), line
    rows = jsonl(isolated / "runs" / out["run_id"] / "tiers.jsonl")
    assert [r.get("offered_rate") for r in rows] == order, "written as probed"
    if 5.0 not in met:  # the bottom failed for sure, or its runs (or the client) could not say
        assert result.code == 1 and fm["boundary_rate"] is None, result.err
        if out["inconclusive"]:
            assert_kept_or_client_bound(result, rates=True)
        else:
            assert order == [5.0], result.err
            assert "5 req/s already failed (the bottom of the search, --rates 5:8)" in result.err
        return
    assert result.code == 0, result.err
    assert fm["first_failing"] == min(set(order) - set(met), default=None)
    said_once = " ".join(result.err.split())
    if out["under_noise"]:  # FAST's --conservative: the boundary's probes could not be called
        taken = _TAKEN.search(said_once)
        assert taken is not None, result.err
        assert float(taken[1]) in met and float(taken[2]) in fm["unsure"], result.err
    else:
        assert fm["boundary_rate"] == max(met), result.err
        assert f"recommended {max(met):g} req/s: the highest offered rate" in said_once, result.err
    c = out["recommended_concurrency"]
    assert c >= 1 and f"which pin and status take as concurrency {c}" in result.err
    assert status.code == 0 and status.json["setting"]["concurrency"] == c
    assert pinned.code == 0, pinned.err
    assert pinned.json["concurrency"] == c
    assert pinned.json["concurrency_from"] == f"sweep run {out['run_id']}"


# a boundary the runs could not call, under FAST's --conservative: the highest rate surely kept
# up with is taken, and the doubt said
_TAKEN = re.compile(
    r"warning: ([0-9.]+) req/s, the conservative answer, taken under noise \(--conservative\): "
    r"the runs cannot tell whether ([0-9.]+) req/s keeps up"
)

# why a probe failed, each as the search says it: an SLO broken, saturated, sent too slowly by
# this process, or not sure it kept up (the shortfall's interval across the 5 % line)
_HONEST = re.compile(
    r"is over the SLO|^fails: saturated: |client-bound: calibrate sent only"
    r"|not sure it kept up: .* — anywhere from .* across the 5% line"
)


def _probe_line(err: str, n: int, rate: float) -> str:
    """What ``find-max probe n: <rate> req/s …`` said of the probe."""
    head = f"find-max probe {n}: {rate:g} req/s "
    lines = [ln for ln in err.splitlines() if ln.startswith(head)]
    assert len(lines) == 1, err
    return lines[0].removeprefix(head)
