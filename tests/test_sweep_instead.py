"""A sweep asked only for levels above what the ladder proved in flight runs the most it
proved instead — and says so (it used to run it quietly)."""

from __future__ import annotations

from pathlib import Path

from tests.mockserver import start_mock
from tests.tier_helpers import FAST, assert_kept_or_client_bound, open_gate

SHORT = f"{FAST}[sweep]\nlevel_s = 0.1\nrepeats = 1\n"


def test_a_sweep_of_levels_all_above_the_ladder_says_what_it_runs_instead(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=4) as mock:
        open_gate(isolated, mock.base_url, SHORT, stage="ladder")  # 4 passed in flight
        instead = cli("sweep", "--concurrency", "8", "--json")
        some = cli("sweep", "--concurrency", "2,8", "--json")
    # what runs instead is said whatever the verdict: beside two CPU-burning processes the
    # level was rightly the client's limit (exit 1), and says so
    assert_kept_or_client_bound(instead, "C ≥ 4")
    warning = next(ln for ln in instead.err.splitlines() if ln.startswith("warning: concurrency"))
    assert warning.startswith("warning: concurrency 8 skipped: the ladder passed with at most 4")
    assert warning.endswith("; running concurrency 4 instead"), warning
    assert [lv["concurrency"] for lv in instead.json["levels_detail"]] == [4]
    assert_kept_or_client_bound(some, "C ≥ ")
    assert "instead" not in some.err  # 2 was asked for and runs: nothing runs in place of 8
