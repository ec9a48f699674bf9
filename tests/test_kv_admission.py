"""A KV cache is full for admission before its usage reads full (issue 37, seen on real vLLM).

vLLM admits a waiting request only when the KV blocks of its prompt are free. With
``--num-gpu-blocks-override 6`` (blocks of 128 tokens) and 180-token prompts, two requests ran on
two blocks each while the rest waited; ``vllm:kv_cache_usage_perc`` read 80 % — below the 90 %
calibrate took for "full" — so the wait was blamed on "its cap is 2" of a server capped at 8, and
the tier became ``stop: cap`` at 2. The rule: k requests using u of the cache leave room for one
more only when u × (k + 1) / k ≤ 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.gpu.reading import Pressure
from calibrate.gpu.vram.peaks import WindowPeak, kv_doubt, kv_peak_margin
from calibrate.gpu.vram.sample import VramSample
from calibrate.stages.measure.tiers import Stats, summarise
from calibrate.stages.server_account.cap import observed_cap, running_unseen, server_limit
from calibrate.stages.server_account.kv import kv_is_full
from calibrate.stages.server_account.queue_note import queue_note
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate

RUNNING = "vllm:num_requests_running"


def _stats(batch: int, **values: object) -> Stats:
    base: dict[str, object] = {
        "batch_size": batch, "concurrency": batch, "round": None, "items": batch, "waves": 1,
        "total_s": 1.0, "per_item_s": 1.0 / batch, "latency_mean_s": 1.0, "latency_p50_s": 1.0,
        "latency_p90_s": 1.0, "latency_p99_s": 1.0, "latency_max_s": 1.0, "ttft_p50_s": None,
        "ttft_p99_s": None, "tpot_p50_s": None, "tpot_p99_s": None, "items_per_s": 4.0,
        "output_tokens_per_s": 40.0, "peak_vram_mib": None, "vram_idle_mib": None,
        "vram_total_mib": None, "pressure": None, "pressure_source": "none",
        "peak_kv_usage": None, "errors": 0, "error_kinds": {}, "first_done_s": 0.5,
        "last_done_s": 1.0, "baseline_match": None, "baseline_items": 0,
    }  # fmt: skip
    return Stats(**{**base, **values})  # type: ignore[arg-type]


def _waited(*, running: int, waiting: int, kv: float) -> Stats:
    """Batch 8: ``waiting`` requests waited while ``running`` ran, the KV cache at ``kv``."""
    return _stats(
        8,
        server_queue_max=waiting,
        server_running_max=running,
        running_while_queued=running,
        running_metric=RUNNING,
        peak_kv_usage=kv,
    )


def test_no_room_for_one_more_request_is_a_full_cache_not_a_cap() -> None:
    seen = _waited(running=2, waiting=6, kv=0.8)
    assert observed_cap(seen) is None
    note = queue_note(6, 8, batch=8, running=2, metric=RUNNING, kv_usage=0.8)
    assert note == (
        "the server queued up to 6 requests at concurrency 8 while it ran 2 at once "
        "(vllm:num_requests_running) with its KV cache full (80%: no room for one more request "
        "beside the 2 running): the KV cache is the limit, not its cap"
    )
    # a cap with room to spare in the cache stays a cap, and says so
    roomy = _stats(8, **{**seen.__dict__, "server_running_max": 4, "running_while_queued": 4})
    for usage in (None, 0.1, 0.7):  # 4 running on 70 %: a fifth fits (0.7 × 5/4 = 0.875)
        capped = _stats(8, **{**roomy.__dict__, "peak_kv_usage": usage})
        assert observed_cap(capped) is not None, usage
        said = queue_note(4, 8, batch=8, running=4, metric=RUNNING, kv_usage=usage)
        assert said is not None and "its cap is 4, below 8 in flight" in said, said
    # 4 running on 80 %: a fifth would fill it to the brim (0.8 × 5/4 = 1), read while the four
    # still grew their answers — no room, and no cap claimed on that doubt
    brim = _stats(8, **{**roomy.__dict__, "peak_kv_usage": 0.8})
    assert observed_cap(brim) is None
    said = queue_note(4, 8, batch=8, running=4, metric=RUNNING, kv_usage=0.8)
    assert said is not None and "no room for one more request beside the 4 running" in said
    assert not kv_is_full(0.5, None, running=None), "no running count: the usage alone decides"
    assert kv_is_full(0.95, None) and kv_is_full(0.1, 3)


def _sample(at_s: float, kv: float, running: float | None = 4.0) -> VramSample:
    return VramSample((), kv, Pressure(kv, "kv_cache"), server_running=running, at_s=at_s)


def test_a_peak_read_while_the_usage_grew_carries_how_much_higher_it_may_have_been() -> None:
    """A usage that grows is read low by what it grew since the last sample: beside CPU
    burners the mock's 83 % read 73 %, and the queue was called "its cap is 4". The most it rose
    from one sample to the next while the same requests ran is how much higher it may have
    been — none where it held still; a request admitted is not growth."""
    idle = _sample(0.0, 0.0, 0.0)
    growing = [idle, _sample(0.05, 0.6), _sample(0.10, 0.65), _sample(0.2, 0.72)]
    assert kv_peak_margin(growing) == pytest.approx(0.07)  # the admission's 0.6 is not growth
    # a second group's answers, read lower than the first's: the first's rises still count
    groups = [*growing, _sample(0.25, 0.3), _sample(0.45, 0.5)]
    assert kv_peak_margin(groups) == pytest.approx(0.2)  # a longer gap, a larger rise across it
    still = [idle, _sample(0.05, 0.7), _sample(0.1, 0.7), _sample(0.15, 0.1, 1.0)]
    assert kv_peak_margin(still) == 0.0  # admitted at 70 %, then it held still
    assert kv_peak_margin([_sample(0.0, 0.5)]) is None
    assert kv_peak_margin([idle, _sample(0.05, 0.6)]) == 0.0  # an admission alone: no growth
    assert kv_peak_margin([_sample(0.0, 0.9), _sample(0.01, 0.99)]) == pytest.approx(0.01)
    # no running count: an admission cannot be told from growth, and counts as growth
    blind = [_sample(0.0, 0.0, None), _sample(0.1, 0.4, None), _sample(0.2, 0.45, None)]
    assert kv_peak_margin(blind) == pytest.approx(0.4)
    # answers of fewer than 3 samples: read anywhere from admission on, all an answer grows —
    # 20-token prompts growing by 40-token answers could have read a third of their peak
    sparse = {"answer_s": 0.2, "gap_s": 0.1, "input_tokens": 20.0, "output_tokens": 40.0}
    assert kv_doubt(0.3, 0.05, **sparse) == pytest.approx(0.6)
    assert kv_doubt(0.6, 0.05, **sparse) == pytest.approx(0.4)  # never past a full cache
    assert kv_doubt(0.3, 0.05, **{**sparse, "gap_s": 0.05}) == pytest.approx(0.05)  # 4 samples
    # a prompt list's tokens are not known per prompt: its windows' own rises are all there is
    # (seen on real vLLM's prompt-list tier: 0 % read, a doubt of 100 points said)
    assert kv_doubt(0.3, 0.05, **{**sparse, "input_tokens": None}) == pytest.approx(0.05)
    assert kv_doubt(0.0, 0.0, **{**sparse, "input_tokens": None}) == 0.0
    assert kv_doubt(None, 0.05, **sparse) is None

    # the rule reads the peak plus that margin: 4 running on 70 % leave room for a fifth
    # (0.875 of the cache) — unless the usage may have peaked 10 points higher (1.0)
    capped = _waited(running=4, waiting=4, kv=0.7)
    assert observed_cap(capped) is not None
    assert observed_cap(_stats(8, **{**capped.__dict__, "kv_peak_margin": 0.02})) is not None
    doubt = _stats(8, **{**capped.__dict__, "kv_peak_margin": 0.1})
    assert observed_cap(doubt) is None
    said = queue_note(4, 8, batch=8, running=4, metric=RUNNING, kv_usage=0.7, kv_margin=0.1)
    assert said == (
        "the server queued up to 4 requests at concurrency 8 while it ran 4 at once "
        "(vllm:num_requests_running) with its KV cache perhaps full (70% read, and it may have "
        "peaked 10 points higher between samples: perhaps no room for one more request beside "
        "the 4 running): no cap is claimed from it"
    )
    assert kv_is_full(0.85, None, margin=0.05) and not kv_is_full(0.85, None, margin=0.04)

    # read often enough, its requests waited while 4 ran: a cap, or all the cache held — only
    # the margin can tell, and it cannot; the tier did not run 8 at once and is not the setting
    dense = {"latency_p50_s": 1.0, "metrics_gap_s": 0.05}
    unsure = running_unseen(_stats(8, **{**doubt.__dict__, **dense}), 0.05, None, 0.9)
    assert unsure is not None and not unsure.read_through, unsure
    assert unsure.why == (
        "vllm:num_requests_running peaked at 4 while up to 4 requests waited, and its KV cache "
        "read 70% (it may have peaked 10 points higher between samples): whether 4 was its cap "
        "or all its cache held is unknown — it did not run 8 at once"
    )
    full = _stats(8, **{**capped.__dict__, "peak_kv_usage": 0.8})  # no room for a fifth, read
    for sure in (capped, full):  # a cap claimed; a cache full as read: each says what it was
        assert not running_unseen(_stats(8, **{**sure.__dict__, **dense}), 0.05, None, 0.9)

    # the sweep's ceiling is the same either way: levels above 4 ran at most 4 at once, and are
    # left out of its knee (with the doubt said), never recommended on a reading that cannot tell
    ceiling = server_limit(None, 8, [doubt])
    assert ceiling is not None and ceiling.slots == 4, ceiling
    assert "whether 4 was its cap or all its cache held is unknown" in ceiling.source
    assert server_limit(None, 8, [capped]) == observed_cap(capped)  # a cap claimed: as before
    assert server_limit(None, 8, [full]) is None  # all the cache held, as read: no ceiling
    ran8 = _stats(8, server_queue_max=0, server_running_max=8, running_metric=RUNNING)
    assert server_limit(None, 8, [doubt, ran8]) is None  # 8 ran at once elsewhere: no cap of 4

    # a tier's margin is that of the window its peak was read in
    monitor_peaks = [
        _peak(0.7, 0.1),
        _peak(0.5, 0.3),
    ]
    stats = summarise(
        batch_size=8, concurrency=8, round_no=None, items=[], total_s=1.0, peaks=monitor_peaks,
        baseline_text=None,
    )  # fmt: skip
    assert stats.peak_kv_usage == 0.7 and stats.kv_peak_margin == 0.1


def _peak(kv: float, margin: float) -> WindowPeak:
    return WindowPeak(None, None, Pressure(kv, "kv_cache"), kv, None, 3, kv_peak_margin=margin)


@pytest.mark.parametrize("scrape_s", [0.0, 0.12], ids=["quiet", "slow-metrics"])
def test_a_cache_too_small_for_one_more_on_the_mock_is_named_as_such(
    cli, isolated: Path, scrape_s: float
) -> None:
    """8 slots, a KV cache of 4.8 requests' prompt and answer: four run, the fifth waits for
    room while the usage peaks about 83 %. Not a cap of 4: the KV cache is the limit.

    The rule reads the peak from samples, and a usage that grows is read low by what it grew
    since the last one: beside CPU burners the samples came far enough apart to read 73 %, and
    the queue was called a cap. A ``/metrics`` that answers 0.12 s late does the same on a quiet
    machine; the peak's margin (``kv_peak_margin``) keeps the rule from claiming a cap on it."""
    kv = {
        "kv_mib_per_1k_tokens": 1000.0,
        "kv_capacity_tokens": int(4.8 * (20 + 40)),
        "on_kv_full": "queue",
        "preallocate": True,
        "metrics_delay_s": scrape_s,
    }
    config = FAST.replace("[ladder]\n", "[ladder]\nbatch_sizes = [8]\nrounds = 1\n")
    config += "[prompt]\nmax_tokens = 40\n"
    # the quiet case with 0.85 s answers: at 0.21 s two CPU burners once delivered the eight so far
    # apart that none waited (server_queue_max 0); the slow scrape's doubt is of 0.21 s answers
    per_token_s = 0.004 if scrape_s else 0.02
    with start_mock(
        ttft_s=0.05, per_token_s=per_token_s, slots=8, metrics_style="vllm", **kv
    ) as mock:
        open_gate(isolated, mock.base_url, config)
        result = cli("ladder", "--json", "--input-tokens", "20", "--output-tokens", "40")
    # read too seldom to tell its cap from its cache (always with the slow /metrics; on a busy
    # machine the quiet one's samples come as far apart), batch 8 is not the setting — and, the
    # one tier, no setting is known: inconclusive, exit 1 (it passed with none, "last_passing":
    # null). Read often enough, the cache is the limit and batch 8 the setting, exit 0.
    err = " ".join(result.err.split())
    unsure = "batch 8 is not the setting: " in err
    assert result.code == (1 if unsure else 0), result.err
    assert result.json["inconclusive"] if unsure else result.json["last_passing"], result.json
    (tier,) = result.json["tiers_detail"]
    read = {k: tier.get(k) for k in ("peak_kv_usage", "kv_peak_margin", "metrics_gap_s")}
    assert tier["server_queue_max"] >= 1 and tier["running_while_queued"] == 4, tier
    assert tier["peak_kv_usage"] < 0.9, "the case: full for admission, not by its usage"
    assert tier["verdict"] != "stop: cap", (read, result.err)
    assert "no room for one more request beside the 4 running" in err, err
    assert "its cap is 4" not in err
    if scrape_s:  # read too seldom to tell its cap from its cache: not the setting either
        assert unsure, err
    if unsure:
        assert "ladder inconclusive: no kept tier is known to have run whole" in err, err
