"""The knee's Welch interval is taken at ``[confidence] level`` (SPEC §13): the same runs are
"cannot be told from noise" at 95 % and a gain at 80 %; the level reaches the sweep's --json."""

from __future__ import annotations

from pathlib import Path

from calibrate import config
from calibrate.confidence import compare, spread
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.stages.verdict.knee import Point, find_knee, judge, judged_range, needs_repeat
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import CONSERVATIVE, FAST, open_gate

# c=1 three runs, c=4 four runs: the medians 45 and 52 (+16 %, over gain_min 10 %), the ranges
# 40–50 and 48–55 overlap. Welch's interval of the means' difference (4 − 1, df ≈ 3.07) is
# −3.47…+16.97 items/s at 95 % (holds zero) and +1.46…+12.04 at 80 % (wholly above zero).
ONE_RUNS = (40.0, 45.0, 50.0)
FOUR_RUNS = (48.0, 51.0, 53.0, 55.0)


def _runs(concurrency: int, *runs: float) -> Point:
    span = judged_range(runs)
    assert span is not None
    ordered = sorted(runs)
    return Point(concurrency, ordered[len(ordered) // 2], 0, span[0], span[1], tuple(runs))


ONE, FOUR = _runs(1, *ONE_RUNS), _runs(4, *FOUR_RUNS)


def test_the_numbers_hold_zero_at_95_and_not_at_80() -> None:
    wide = compare(spread(ONE_RUNS, 0.95), spread(FOUR_RUNS, 0.95))
    narrow = compare(spread(ONE_RUNS, 0.80), spread(FOUR_RUNS, 0.80))
    assert wide.ci_low is not None and wide.ci_low < 0 < (wide.ci_high or 0)
    assert narrow.ci_low is not None and narrow.ci_low > 0
    assert FOUR.span[0] <= ONE.span[1], "the ranges overlap: only the interval can decide"


def test_the_level_decides_the_gain_the_repeat_and_the_knee() -> None:
    assert judge(ONE, FOUR, 0.10) == "unsure"  # the default: 95 %
    assert judge(ONE, FOUR, 0.10, 0.95) == "unsure"
    assert judge(ONE, FOUR, 0.10, 0.80) == "gain"
    assert needs_repeat([ONE], FOUR, 0.10, runs=4, max_repeats=6, level=0.95)
    assert not needs_repeat([ONE], FOUR, 0.10, runs=4, max_repeats=6, level=0.80)
    at_95 = find_knee([ONE, FOUR], 0.10, 0.95)
    assert at_95 is not None and at_95.knee.concurrency == 1 and at_95.best.concurrency == 1
    assert "whether it adds 10 % cannot be told from noise" in at_95.text and at_95.noisy
    at_80 = find_knee([ONE, FOUR], 0.10, 0.80)
    assert at_80 is not None and at_80.knee.concurrency == 4 and at_80.best.concurrency == 4


def test_the_sweep_options_carry_the_configured_level(tmp_path: Path) -> None:
    path = tmp_path / "calibrate.toml"
    write_config(path, "http://127.0.0.1:9", "[confidence]\nlevel = 0.8\n")
    cfg = config.load(config.Overrides(config_path=str(path)), {})
    assert SweepOptions.from_config(cfg, 4).confidence == 0.8
    write_config(path, "http://127.0.0.1:9", "")
    cfg = config.load(config.Overrides(config_path=str(path)), {})
    assert SweepOptions.from_config(cfg, 4).confidence == 0.95


def test_the_sweep_json_names_the_level_its_knee_used(cli, isolated: Path) -> None:
    # the format only: whether the mock's levels separate is the machine's business
    sweep = FAST + "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 2\n"
    with start_mock(ttft_s=0.01, per_token_s=0.001, slots=2) as mock:
        config = sweep.replace(CONSERVATIVE, "[confidence]\nconservative = true\nlevel = 0.8\n")
        open_gate(isolated, mock.base_url, config, stage="ladder")
        result = cli("sweep", "--json", "--beyond-ladder")
    assert result.code in (0, 1), result.err
    assert result.json["confidence"] == 0.8
