"""``sweep --find-max`` (SPEC §13): the largest concurrency that meets every SLO, found by an
exponential probe and a bisection — the pure search against simulated boundaries (every one on
[1, 1024] counted), the probe rule on noisy runs, the sweep on a simulated 4-slot server (where
the boundary, the windows and the cliff are judged, on a virtual clock), and the real CLI end to
end against a mock that runs out of memory at 2 in flight (exit code, records, status, pin)."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from calibrate.cli.output import Output
from calibrate.cli.views.sweep import SweepView
from calibrate.config import Config, SloConfig, SweepConfig
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.io.junit import JUnitSuite
from calibrate.stages.measure.tiers import Stats, summarise
from calibrate.stages.sweep.find_max import (
    PRECISION,
    TOP,
    Probe,
    bracket,
    find_max,
    judge_probe,
    next_probe,
)
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.fakes import passing_ladder
from tests.mockserver import start_mock
from tests.stage_fakes import SimulatedLoop, close_runs, recorder, stage_ctx
from tests.tier_helpers import (
    FAST,
    PIN_SERVER,
    jsonl,
    junit_cases,
    open_gate,
    run_dir,
)

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

TTFT = SloConfig(ttft_p99_s=0.1)


def search(passes: Any, top: int = TOP) -> list[Probe]:
    """Run the search against ``passes(concurrency) -> bool``; the probes in order."""
    history: list[Probe] = []
    while (level := next_probe(history, top)) is not None:
        assert all(p.level != level for p in history), f"{level} probed twice"
        assert len(history) < 40, "the search does not end"
        history.append(Probe(level, bool(passes(level))))
    return history


def within(history: list[Probe], boundary: int) -> None:
    """The bracket holds the boundary and is within 5 % (or 1)."""
    last, first = bracket(history)
    assert last is not None and first is not None
    assert last <= boundary < first
    assert first - last <= 1 or first - last <= PRECISION * last


def test_every_boundary_on_1_to_1024_is_found_to_5_percent_in_at_most_10_probes() -> None:
    """SPEC §13's claim, counted for every boundary, not one example."""
    counts = {}
    for boundary in range(1, TOP):
        history = search(lambda c, b=boundary: c <= b)
        within(history, boundary)
        counts[boundary] = len(history)
    assert max(counts.values()) == 10, "≤ 10 probes everywhere (and the worst case is 10)"
    assert counts[4] == 5 and counts[37] == 9 and counts[1] == 4


def test_a_boundary_at_1_at_37_and_one_never_reached() -> None:
    at_one = search(lambda c: c <= 1)
    assert [p.level for p in at_one] == [1, 8, 3, 2]
    assert bracket(at_one) == (1, 2)
    at_37 = search(lambda c: c <= 37)
    assert [p.level for p in at_37] == [1, 8, 64, 23, 38, 30, 34, 36, 37]
    assert bracket(at_37) == (37, 38), "lands on 37 itself"
    never = search(lambda c: True)
    assert [p.level for p in never] == [1, 8, 64, 512, 1024]
    assert bracket(never) == (1024, None)
    result = find_max(never, TTFT)
    assert result.first_failing is None and result.cliff is None
    assert "every probe met the SLOs up to 1024, the top of the search; 5 probes" in result.text
    failing_one = search(lambda c: False)
    assert [p.level for p in failing_one] == [1] and bracket(failing_one) == (None, 1)


def test_a_lower_top_caps_the_search() -> None:
    """An unmanaged server: the search never sends more than the ladder proved."""
    history = search(lambda c: True, top=6)
    assert [p.level for p in history] == [1, 6]
    history = search(lambda c: c <= 4, top=6)
    assert max(p.level for p in history) == 6 and bracket(history) == (4, 5)


def _run(concurrency: int, ttft_p99_s: float | None, *, errors: int = 0, items: int = 20) -> Stats:
    """One run's stats with a given TTFT p99 (and failed requests)."""
    stats = summarise(
        batch_size=1,
        concurrency=concurrency,
        round_no=1,
        items=[],
        total_s=1.0,
        peaks=[],
        baseline_text=None,
    )
    kinds = {"oom": errors} if errors else {}
    return replace(stats, ttft_p99_s=ttft_p99_s, errors=errors, error_kinds=kinds, items=items)


def test_the_probe_rule_is_the_median_of_the_runs_p99s() -> None:
    """One spike in three runs does not fail a level, two do; errors always fail it; an SLO
    that cannot be measured (not streamed) is a miss."""
    one_spike = judge_probe(8, [_run(8, 0.05), _run(8, 0.4), _run(8, 0.06)], TTFT)
    assert one_spike.passed and one_spike.p99("ttft") == 0.06
    two = judge_probe(8, [_run(8, 0.05), _run(8, 0.4), _run(8, 0.3)], TTFT)
    assert not two.passed
    assert two.why == "ttft p99 0.3 s is over the SLO 0.1 s (median of 3 runs)"
    errors = judge_probe(8, [_run(8, 0.05, errors=3, items=32)], TTFT)
    assert not errors.passed and errors.why == "3 of 32 requests failed (oom×3)"
    unstreamed = judge_probe(8, [_run(8, None)], TTFT)
    assert not unstreamed.passed and "not measured" in unstreamed.why
    both = judge_probe(2, [_run(2, 0.05)], replace(TTFT, e2e_p99_s=1e-9))
    assert not both.passed and "latency" not in both.why and both.why.startswith("e2e p99")


def test_noisy_probes_still_land_within_5_percent_of_the_boundary() -> None:
    """A server whose TTFT p99 is 60 % of the SLO up to 37 and 3× it above, each run scattered
    ±50 % (seeded), and one probe in three with one run far off (8× or a tenth): with three runs
    a probe the median rule finds the boundary every time; one run a probe is fooled."""
    fooled = 0
    for seed in range(30):
        rng = random.Random(seed)

        def runs_at(level: int, repeats: int, rng: random.Random = rng) -> list[Stats]:
            base = 0.06 if level <= 37 else 0.3
            off = rng.randrange(repeats) if rng.random() < 1 / 3 else None
            factors = [rng.uniform(0.5, 1.5) for _ in range(repeats)]
            if off is not None:
                factors[off] = 8.0 if base < 0.1 else 0.1
            return [_run(level, base * f) for f in factors]

        history: list[Probe] = []
        while (level := next_probe(history)) is not None:
            history.append(judge_probe(level, runs_at(level, 3), TTFT))
        within(history, 37)
        assert len(history) <= 10
        single: list[Probe] = []
        while (level := next_probe(single)) is not None:
            single.append(judge_probe(level, runs_at(level, 1), TTFT))
        last, first = bracket(single)
        fooled += not (last is not None and first is not None and last <= 37 < first)
    assert fooled > 10, "one run a probe is fooled by a far-off run: the repeats matter"


def test_an_erroring_level_is_a_failing_one_and_the_result_says_why() -> None:
    """Requests fail from 13 on (out of memory), the TTFT SLO holds everywhere below."""

    def probe(level: int) -> Probe:
        runs = (
            [_run(level, 0.02, errors=2, items=4 * level)] if level >= 13 else [_run(level, 0.02)]
        )
        return judge_probe(level, runs, TTFT)

    history: list[Probe] = []
    while (level := next_probe(history)) is not None:
        history.append(probe(level))
    result = find_max(history, TTFT)
    assert (result.last_passing, result.first_failing) == (12, 13)
    assert result.cliff is None, "errors are no jump of an SLO metric"
    assert "concurrency 13 failed: 2 of 52 requests failed (oom×2)" in result.text
    assert result.to_json()["first_failing_why"] == "2 of 52 requests failed (oom×2)"


def test_the_cliff_is_the_jump_of_the_slo_the_failing_level_breaks() -> None:
    steep = find_max(
        [Probe(4, True, (("ttft", 0.03),)), Probe(5, False, (("ttft", 0.25),), why="over")],
        TTFT,
    )
    assert steep.cliff is not None and steep.cliff.steep
    assert steep.to_json()["cliff"] == {
        "slo": "ttft",
        "bound_s": 0.1,
        "last_passing_p99_s": 0.03,
        "first_failing_p99_s": 0.25,
        "jump": 8.333333,
        "over_slo": 2.5,
        "steep": True,
    }
    assert "median ttft p99 0.03 → 0.25 s from 4 to 5 (×8.3), 2.5× the SLO: a cliff" in steep.text
    gentle = find_max(
        [Probe(36, True, (("ttft", 0.095),)), Probe(38, False, (("ttft", 0.11),), why="x")],
        TTFT,
    )
    assert gentle.cliff is not None and not gentle.cliff.steep
    assert "a gradual rise, not a cliff" in gentle.text


def _sweep(tmp_path: Path, loop: SimulatedLoop, top: int = TOP) -> Sweep:
    cfg = Config(sweep=replace(SweepConfig(), level_s=0.5, repeats=3), slo=TTFT)
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    options = replace(
        SweepOptions.from_config(cfg, 4, slo=TTFT, stream=True),
        find_max_top=top,
        max_repeats=3,
    )
    return Sweep(ctx, options, monitor, recorder(ctx, monitor, tmp_path), loop)


def test_the_sweep_finds_four_on_a_simulated_four_slot_server(tmp_path: Path) -> None:
    """0.2 s a request, TTFT a quarter of the time from the request's start (the queue wait
    included): 4 in flight answer in 0.05 s, a 5th waits for a slot and breaks 0.1 s."""
    loop = SimulatedLoop(lambda concurrency, repeat: 0.2, slots=4)
    sweep = _sweep(tmp_path, loop)
    said: list[str] = []
    sweep.note = said.append
    result = sweep.run()
    fm = result.find_max
    assert fm is not None and (fm.last_passing, fm.first_failing) == (4, 5)
    assert fm.order == (1, 8, 3, 5, 4) and fm.probes == 5
    assert [lv.concurrency for lv in result.levels] == [1, 3, 4, 5, 8], "shown by concurrency"
    assert [lv.verdict for lv in result.levels] == ["pass"] * 3 + ["stop: slo"] * 2
    assert all(len(lv.runs) == 3 for lv in result.levels), "repeats per probe, no more"
    # each run lasts ≥ 3× the p50 of the nearest level *below* it (0.2 s), not of the probe
    # before it: after 8 (p50 0.4 s, queued) the windows would double for nothing
    windows = {c: round(w.min_s, 6) for c, w, _ in loop.runs}
    assert windows == {1: 0.5, 8: 0.6, 3: 0.6, 5: 0.6, 4: 0.6}
    assert result.passed and result.best is not None and result.best.concurrency == 4
    summary = result.summary(sweep.options)
    assert summary.recommended_concurrency == 4
    assert summary.details["find_max"]["last_passing"] == 4
    assert summary.details["load_mode"] == "find-max" and summary.details["knee"] is None
    assert said[0] == "find-max probe 1: concurrency 1 meets the SLOs"
    assert said[1].startswith("find-max probe 2: concurrency 8 breaks them: ttft p99")
    rows = jsonl(sweep.ctx.run.path / "tiers.jsonl")
    assert [r["concurrency"] for r in rows] == [1, 8, 3, 5, 4], "written as probed"
    assert result.recommendation.startswith(
        "concurrency 4: the most in flight that met every SLO (ttft p99 ≤ 0.1 s); "
        "concurrency 5 broke them: median ttft p99 0.05 → "
    )
    assert all(lv.gain is None for lv in result.levels), "probed out of order: no gain column"
    # the cliff: the 5th in flight waits a whole request (0.2 s) for a slot, 2.5× the SLO
    cliff = fm.to_json()["cliff"]
    assert cliff["slo"] == "ttft" and cliff["last_passing_p99_s"] == pytest.approx(0.05)
    assert cliff["first_failing_p99_s"] == pytest.approx(0.25) and cliff["steep"] is True
    assert "2.5× the SLO: a cliff" in result.recommendation
    # JUnit (--junit): over an SLO is how the search ends, never a failed case
    done = SimpleNamespace(result=result, record=SimpleNamespace(comparison=None))
    view = SweepView(Output(json_mode=True), sweep.ctx)
    suite = view.junit(done, JUnitSuite("sweep"))  # type: ignore[arg-type]
    assert [c.name for c in suite.cases] == [f"concurrency {c}" for c in (1, 3, 4, 5, 8)]
    assert all(c.failure is None for c in suite.cases)


def test_a_sweep_whose_first_level_breaks_the_slo_fails(tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, SimulatedLoop(lambda concurrency, repeat: 0.8, slots=4))
    result = sweep.run()
    assert result.find_max is not None and result.find_max.order == (1,)
    assert not result.passed and result.summary(sweep.options).recommended_concurrency is None
    assert result.reason.startswith(
        "no level met the SLOs (ttft p99 ≤ 0.1 s): concurrency 1 already broke them: ttft p99 "
    )
    assert result.recommendation == ""


def test_an_erroring_level_ends_the_exponential_probe(tmp_path: Path) -> None:
    """Requests fail at 8 (an OOM): the search bisects below it, the SLO holds everywhere."""
    loop = SimulatedLoop(lambda concurrency, repeat: 0.01, slots=64, fail_at=8)
    sweep = _sweep(tmp_path, loop)
    said: list[str] = []
    sweep.note = said.append
    result = sweep.run()
    assert said[1] == "find-max probe 2: concurrency 8 fails: 8 of 8 requests failed (oom×8)"
    fm = result.find_max
    assert fm is not None and fm.order[:2] == (1, 8) and fm.first_failing == 8
    assert fm.last_passing == 7 and fm.cliff is None
    assert [lv.verdict for lv in result.levels][-1] == "fail"
    assert len(result.levels[-1].runs) == 1, "a failing run ends the probe's repeats"


# short probes, one run each: the HTTP tests here are about the CLI, not where a boundary lands
CONFIG = FAST + "[sweep]\nlevel_s = 0.1\nrepeats = 1\n"


def test_find_max_end_to_end_exit_0_records_status_pin_and_junit(cli, isolated: Path) -> None:
    """The CLI end to end: ``sweep --find-max --slo ttft:5`` on a mock that runs out of memory
    at 2 in flight, whose ladder proved 2 (so the search is 1 then 2, two short probes), ends at
    1, says so, writes it to the ledger, and status and pin take it as C — no verdict here hangs
    on a measured time. Where an SLO boundary lands (4 slots: 4, 5 queues past a TTFT bound),
    the probes' order, the windows and the cliff's ratios are
    test_the_sweep_finds_four_on_a_simulated_four_slot_server's (a virtual clock)."""
    with start_mock(ttft_s=0.005, per_token_s=0.001, answer_tokens=10, oom_at=1) as mock:
        target = open_gate(isolated, mock.base_url, CONFIG + PIN_SERVER, stage="ladder")
        passing_ladder(isolated, target, 2)
        result = cli("sweep", "--find-max", "--slo", "ttft:5", "--json", "--junit", "sweep.xml")
        status = cli("status", "--json")
        pinned = cli("pin", "--json")
    assert result.code == 0, result.err
    out = result.json
    fm = out["find_max"]
    assert fm["order"] == [1, 2] and (fm["last_passing"], fm["first_failing"]) == (1, 2), out
    assert fm["cliff"] is None, "a level that errs is no jump of an SLO metric"
    assert out["load_mode"] == "find-max" and out["recommended_concurrency"] == 1
    assert "recommended concurrency 1: the most in flight that met every SLO" in result.err
    assert "find-max probe 1: concurrency 1 meets the SLOs" in result.err
    assert "find-max probe 2: concurrency 2 fails: " in result.err and "(oom×" in result.err
    rows = jsonl(run_dir(isolated, out["run_id"]) / "tiers.jsonl")
    assert [r["concurrency"] for r in rows] == [1, 2], "written as probed"
    ledger = [e for e in jsonl(isolated / "runs/ledger.jsonl") if e["stage"] == "sweep"][-1]
    assert ledger["summary"]["find_max"]["last_passing"] == 1
    assert ledger["summary"]["recommended_concurrency"] == 1
    assert status.code == 0, status.err
    setting = status.json["setting"]
    assert (setting["concurrency"], setting["source"]) == (1, "sweep"), "status takes it as C"
    assert pinned.code == 0, pinned.err
    assert pinned.json["concurrency"] == 1 and "--max-num-seqs 2" in pinned.json["command"]
    assert pinned.json["concurrency_from"] == f"sweep run {out['run_id']}", "pin takes it as C"
    _, cases = junit_cases(isolated / "sweep.xml")
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed == ["concurrency 2"], "a probe that errs is a failed case (over an SLO is not)"


def test_find_max_refuses_other_load_modes_and_needs_an_slo(cli, isolated: Path) -> None:
    """Exit 2 before anything is sent or written (no server runs here)."""
    open_gate(isolated, "http://127.0.0.1:9/v1", CONFIG, stage="ladder")
    for extra, said in (
        (["--auto"], "with --auto"),
        (["--concurrency", "1,2"], "with --concurrency"),
        (["--rates", "1,2"], "--find-max --rates '1,2': give the range to search as LO:HI"),
        (["--rates", "1:2000"], "at most 1024× wide (2000× given)"),
    ):
        result = cli("sweep", "--find-max", "--slo", "ttft:0.1", *extra)
        assert result.code == 2 and said in result.err, result.err
    bare = cli("sweep", "--find-max")
    assert bare.code == 2
    assert "--find-max needs an SLO: add [slo] ttft_p99_s = 0.1" in bare.err
    assert "or --slo ttft:0.1" in bare.err
    bad = cli("sweep", "--find-max", "--slo", "ttft:-1")
    assert bad.code == 2 and "--slo 'ttft:-1' is not NAME:SECONDS" in bad.err
    assert [p.name for p in (isolated / "runs").iterdir()] == ["ledger.jsonl"], "nothing written"


@pytest.mark.parametrize(
    ("slo", "said"),
    [("[slo]\nttft_p99_s = 5\n", "ttft p99 ≤ 5 s"), ("[slo]\ne2e_p99_s = 5\n", "e2e p99 ≤ 5 s")],
)
def test_find_max_takes_the_slo_from_the_config(cli, isolated: Path, slo: str, said: str) -> None:
    """No --slo: [slo] is the SLO; an unmanaged server is searched only up to what the ladder
    proved (4 here), said so. SLOs of 5 s that every probe meets however busy the machine:
    which SLO and range, not a boundary (a ttft bound of 0.1 s missed at 4 under two CPU hogs)."""
    with start_mock(ttft_s=0.004, per_token_s=0.0005, slots=4) as mock:
        open_gate(isolated, mock.base_url, CONFIG + slo, stage="ladder")
        result = cli("sweep", "--find-max", "--json")
    assert result.code == 0, result.err
    assert (
        "find-max searches concurrency 1–4 only" in result.err and "--beyond-ladder" in result.err
    )
    assert f"the largest concurrency in 1–4 that meets {said}" in result.err
    fm = result.json["find_max"]
    assert fm["order"] == [1, 4] and fm["last_passing"] == 4 and fm["first_failing"] is None
    assert result.json["recommended_concurrency"] == 4


@pytest.mark.parametrize("bound_from", [5, 4])
def test_a_boundary_probe_the_client_limited_is_inconclusive_not_a_setting(
    tmp_path: Path, bound_from: int
) -> None:
    """The self-check saw calibrate itself CPU-bound at the first failing (5) or the last passing
    (4) probe: the SLO miss may be the client's, so the sweep recommends nothing and fails."""

    class Starved(SimulatedLoop):
        def __init__(self, monitor: SelfLoadMonitor) -> None:
            super().__init__(lambda concurrency, repeat: 0.2, slots=4)
            self.monitor = monitor

        def closed_loop(
            self, supply: Any, concurrency: int, window: Any, max_tokens: Any = None
        ) -> Any:
            cpu = 0.97 if bound_from <= concurrency <= 5 else 0.2
            for _ in range(2):
                self.monitor.observe(1.0, cpu, 0.0)
            return super().closed_loop(supply, concurrency, window, max_tokens)

    monitor = SelfLoadMonitor()
    sweep = _sweep(tmp_path, Starved(monitor))
    sweep.selfload = monitor
    result = sweep.run()
    assert result.find_max is not None and result.find_max.first_failing == 5
    assert not result.passed
    assert result.inconclusive.startswith(
        f"inconclusive: the client was the limit at C = {bound_from}, the "
    ), result.inconclusive
    assert result.summary(sweep.options).recommended_concurrency is None
    # what to do names only levels below the limit it names (it once listed 8, probed first)
    hint = result.what_to_do
    below = hint.split("--concurrency ")[1].split(",") if "--concurrency " in hint else []
    assert below and all(int(c) < bound_from for c in below), hint
