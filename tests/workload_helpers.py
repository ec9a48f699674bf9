"""Helpers of the workload and context-ladder tests: a calibrated mock target, fast."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from calibrate.config import LadderConfig
from tests.helpers import write_config

# Fast mock timings: a 200-token forced answer takes about 40 ms.
FAST_MOCK: dict[str, Any] = {"ttft_s": 0.002, "per_token_s": 0.0002}
# Answers the server's running count is sure to see (~70 ms: several 20 ms samples): a ladder
# whose every tier ran too briefly for its count to show B names no setting (inconclusive), so a
# test whose ladder starts above batch 1 on plain prompts uses these.
SEEN_MOCK: dict[str, Any] = {"ttft_s": 0.03, "per_token_s": 0.002}
_ROUND = (
    "min_round_s = 0\n"
    if "min_round_s" in {f.name for f in dataclasses.fields(LadderConfig)}
    else ""
)
# latency_rise = 100.0 switches the latency rule off: these tests' tiers send prompts of their
# own lengths (a task file's sample or longest, a context step), so the time per item moves with
# the prompt as well as the load, and ms-scale answers jitter on a busy 2-core machine; at the
# default 1.25 the seeded-sample ladder stopped at batch 4 now and then and sent other prompts.
# The rule is tested where it is the point: test_preemption_is_stopped_... sets it to 1.25.
# [confidence] conservative and max_rounds = 2: as tier_helpers.FAST, a setting noise leaves in
# doubt is taken conservatively, with two rounds a tier and no more (tests here count requests).
LADDER = (
    "[confidence]\nconservative = true\n"
    f"[ladder]\nsample_interval_s = 0.02\nlatency_rise = 100.0\nmax_rounds = 2\n{_ROUND}"
)


def calibrated(cli: Any, root: Path, base_url: str, extra: str = LADDER) -> None:
    """Config, a single-call baseline and a passing repro: the ladder's gate is open."""
    write_config(root / "calibrate.toml", base_url, extra)
    assert cli("single").code == 0
    assert cli("repro", "--runs", "1").code == 0


def tiers(result: Any) -> list[dict[str, Any]]:
    return list(result.json["tiers_detail"])
