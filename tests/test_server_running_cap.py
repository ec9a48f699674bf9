"""The server's own running count is its cap (issue 37, SPEC §6.1), and the queue is named by its
cause.

Seen on real vLLM (``vllm serve … --max-num-seqs 4``, unmanaged): no ``/props``, so the ladder
passed every tier and chose batch 8 ("the server queued up to 4 requests at concurrency 8" —
kept anyway), the sweep said "knee 8", pin wrote ``--max-num-seqs 8``. Its ``/metrics`` said the
truth: ``vllm:num_requests_running`` peaked at 4 while ``vllm:num_requests_waiting`` held the rest.
The mock's running gauge holds at its slots under every ``--metrics-style``, as each engine's
does, so these run without vLLM.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from calibrate import config
from calibrate.gpu.reading import VramReading
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.peaks import SAMPLES_PER_ANSWER
from calibrate.io.tier_table.cells import row_json
from calibrate.server import process
from calibrate.server.process.target import managed_target, running_kind
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tiers import Stats, Unseen, summarise
from calibrate.stages.server_account.cap import (
    observed_cap,
    running_unseen,
    server_limit,
    stopping_cap,
    unaccounted,
)
from calibrate.stages.server_account.queue_note import queue_note
from calibrate.state.ledger import Ledger, LedgerEntry
from tests.fakes import free_port, mock_command
from tests.front_proxy import FrontProxy
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, jsonl, open_gate, run_dir

# the running count read every 5 ms: answers of ~10 ms are seen running (the shared tests' 20 ms
# would leave most of them unconfirmed); sweeps and repro here keep the shared FAST
LADDER = FAST.replace("[ladder]\n", "[ladder]\nbatch_sizes = [1, 2, 4, 8]\nrounds = 1\n").replace(
    "sample_interval_s = 0.02", "sample_interval_s = 0.005"
)
RUNNING = {
    "vllm": "vllm:num_requests_running",
    "sglang": "sglang:num_running_reqs",
    "llamacpp": "llamacpp:requests_processing",
    "tgi": "tgi_batch_current_size",
    "mock": "vllm:num_requests_running",
}


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


def _why(unseen: Unseen | None, *, read_through: bool = False) -> str:
    """What the tier says, where its count could not show it ran B; whether that is its own
    witness (read through every answer) or samples that could have missed B running, so that
    another tier's count may still vouch for it."""
    assert unseen is not None and unseen.read_through is read_through, unseen
    return unseen.why


def test_requests_waiting_while_the_running_count_held_below_b_is_the_cap() -> None:
    capped = _stats(
        8,
        server_queue_max=4,
        server_running_max=4,
        running_while_queued=4,
        running_metric="vllm:num_requests_running",
    )
    cap = observed_cap(capped)
    assert cap == ServerCap(
        4, "vllm:num_requests_running peaked at 4 while up to 4 requests waited"
    )
    # not a cap: nothing waited; it ran B; waiting seen only while it ramped up; a full KV
    # cache; preemptions; every waiting request deferred; no running gauge at all
    for values in (
        {"server_queue_max": 0},
        {"server_running_max": 8, "running_while_queued": 8},
        {"running_while_queued": 2},
        {"peak_kv_usage": 0.97},
        {"preemptions": 3},
        {"deferred_max": 4},
        {"server_running_max": None, "running_while_queued": None},
    ):
        assert observed_cap(_stats(8, **{**capped.__dict__, **values})) is None, values


def test_the_queue_is_named_by_its_cause_never_a_cap_below_one() -> None:
    metric = "vllm:num_requests_running"
    cap = queue_note(4, 8, batch=8, running=4, metric=metric)
    assert cap == (
        "the server queued up to 4 requests at concurrency 8 while it ran 4 at once "
        "(vllm:num_requests_running): its cap is 4, below 8 in flight"
    )
    kv = queue_note(4, 8, batch=8, running=5, metric=metric, kv_usage=0.99)
    assert kv is not None and "KV cache full (99%)" in kv and "not its cap" in kv
    listed = queue_note(4, 1, batch=8, prompt_list=True, running=4, metric=metric)
    assert listed is not None and "counts each prompt of a list as a request" in listed
    assert "its cap is 4, below the 8 prompts" in listed and "below 1" not in listed
    plain_list = queue_note(4, 1, batch=8, prompt_list=True)
    assert plain_list is not None and "below 1" not in plain_list
    deferred = queue_note(3, 8, batch=8, deferred=3)
    assert deferred is not None and "deferred" in deferred and "its cap" not in deferred
    assert queue_note(0, 8) is None


def test_a_server_that_ran_more_elsewhere_in_the_run_has_no_cap_below_that() -> None:
    """Seen on real vLLM (``--max-num-seqs 4``) in prompt-list mode: at batch 8 one request ran
    while three of the list's prompts were still being admitted, and the ladder said "its cap is
    1" — of a server that had run 4 at once a tier before. The most it ran anywhere in the run
    bounds any cap claimed below it: the ladder's tier, the sweep's limit, the ledger's cap and
    the note alike."""
    metric = "vllm:num_requests_running"
    list8 = _stats(
        8, server_queue_max=3, server_running_max=1, running_while_queued=1, running_metric=metric
    )
    ran4 = _stats(4, server_queue_max=0, server_running_max=4, running_metric=metric)
    assert observed_cap(list8) is not None, "alone, it reads as a cap of 1"
    assert observed_cap(list8, ran_elsewhere=4) is None
    assert observed_cap(list8, ran_elsewhere=1) is not None  # no more seen anywhere: a cap
    assert server_limit(None, 8, [ran4, list8]) is None
    assert stopping_cap(None, [ran4, list8]) is None
    note = queue_note(3, 1, batch=8, prompt_list=True, running=1, metric=metric, ran_elsewhere=4)
    assert note is not None and "not a cap" in note and "its cap is" not in note
    # a real cap 4 at batch 8 stands beside tiers that ran 4 at most
    capped = _stats(
        8, server_queue_max=4, server_running_max=4, running_while_queued=4, running_metric=metric
    )
    assert server_limit(None, 8, [ran4, capped]) == observed_cap(capped)


def test_a_server_that_publishes_neither_says_so_once() -> None:
    said = unaccounted(None, running_seen=False)
    assert said is not None and "publishes neither its cap nor a running count" in said
    assert unaccounted(ServerCap(4, "llama.cpp /props total_slots"), False) is None
    assert unaccounted(None, running_seen=True) is None


def test_the_sweeps_limit_is_a_cap_below_its_batch_never_one_at_b() -> None:
    at_cap_b = _stats(4, concurrency=8, server_queue_max=4, server_running_max=4)
    below_b = _stats(
        8,
        server_queue_max=4,
        server_running_max=4,
        running_while_queued=4,
        running_metric="tgi_batch_current_size",
    )
    assert server_limit(None, 4, [at_cap_b]) is None, "a managed server at cap B, C above"
    assert server_limit(None, 8, [below_b]) == observed_cap(below_b)
    known = ServerCap(2, "llama.cpp /props total_slots")
    assert server_limit(known, 8, [below_b]) == known


@pytest.mark.parametrize("style", sorted(RUNNING))
def test_the_ladder_never_keeps_a_tier_above_the_servers_running_cap(
    cli, isolated: Path, style: str
) -> None:
    """No /props, no managed start: only the engine's running gauge knows the cap of 4."""
    with start_mock(ttft_s=0.15, per_token_s=0.0005, slots=4, metrics_style=style) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    tiers = result.json["tiers_detail"]
    assert result.json["last_passing"]["batch_size"] <= 4
    eight = tiers[3]
    if not eight["server_queue_max"] or eight["running_while_queued"] < eight["server_running_max"]:
        # a client too starved to have 8 at the server at once (a fresh clone's run beside two
        # CPU burners: running ≤ 4 in samples 38 ms apart through 0.52 s answers, none waiting,
        # or one seen waiting only while 3 ran, on its way to a slot) measured no cap to stop
        # on; it is not the setting all the same, and says why: the server never ran 8 at once,
        # or its samples too sparse to tell
        assert tiers[3]["server_running_max"] <= 4 and tiers[3]["verdict"] == "pass"
        assert tiers[3]["running_unseen"], tiers[3]
        assert "batch 8 is not the setting: " in " ".join(result.err.split())
        return
    # failed once in a whole quiet run at 5d71391 (batch 8 'pass' with a queue seen), not
    # reproduced in 35 runs after: what each tier read, should it come again
    keys = ("batch_size", "verdict", "server_running_max", "server_queue_max")
    keys += ("running_while_queued", "peak_kv_usage", "kv_peak_margin")
    read = [{k: t.get(k) for k in keys} for t in tiers]
    assert [t["verdict"] for t in tiers] == ["pass", "pass", "pass", "stop: cap"], (
        read,
        result.err,
    )
    # the queue is sampled: a sample taken while the eighth request was still on its way reads 3
    # waiting (CI at a13e593), so any queue up to the four beyond the cap is a cap seen
    assert tiers[3]["server_running_max"] == 4 and 1 <= tiers[3]["server_queue_max"] <= 4, read
    err = " ".join(result.err.split())
    assert f"the server's own cap is 4 ({RUNNING[style]} peaked at 4" in err
    assert f"while it ran 4 at once ({RUNNING[style]}): its cap is 4, below 8 in flight" in err
    assert "publishes neither" not in err


def test_prompt_list_counts_each_prompt_and_says_so(cli, isolated: Path) -> None:
    """vLLM counts each prompt of a /v1/completions list as a request: at batch 8 on 4 slots,
    4 prompts wait. It is the cap, said of prompts, never "its cap is below 1 in flight"."""
    config = LADDER.replace("[ladder]\n", '[ladder]\nmode = "prompt-list"\n')
    with start_mock(ttft_s=0.15, per_token_s=0.0005, slots=4, metrics_style="vllm") as mock:
        open_gate(isolated, mock.base_url, config)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    tiers = result.json["tiers_detail"]
    assert [t["verdict"] for t in tiers] == ["pass", "pass", "pass", "stop: cap"]
    assert [t["concurrency"] for t in tiers] == [1, 1, 1, 1]
    err = " ".join(result.err.split())
    assert "below 1 in flight" not in err
    assert "the server queued up to 4 of the 8 prompts of a prompt-list request at batch 8" in err
    assert "its cap is 4, below the 8 prompts" in err


def test_a_full_kv_cache_queues_without_being_called_the_cap(cli, isolated: Path) -> None:
    """8 slots, a KV cache of 4 requests' prompt and answer: at batch 8 the rest wait for KV
    room while the running count stays below 8. The KV cache is the limit, not a cap."""
    kv = {
        "kv_mib_per_1k_tokens": 1000.0,
        "kv_capacity_tokens": 4 * (20 + 40),
        "on_kv_full": "queue",
        "preallocate": True,
    }
    config = LADDER.replace("[1, 2, 4, 8]", "[8]").replace(
        "[ladder]\n", "[ladder]\nvram_limit = 0.99\n"
    )
    config += "[prompt]\nmax_tokens = 40\n"
    with start_mock(ttft_s=0.05, per_token_s=0.004, slots=8, metrics_style="vllm", **kv) as mock:
        open_gate(isolated, mock.base_url, config)
        result = cli("ladder", "--json", "--input-tokens", "20", "--output-tokens", "40")
    assert result.code in (0, 1), result.err
    tier = result.json["tiers_detail"][0]
    assert tier["server_queue_max"] >= 1 and tier["server_running_max"] < 8
    # full when sampled, or so near it that one more request had no room (the admission rule:
    # a machine at load 14 sampled 0.88 with 7 running)
    peak, running = tier["peak_kv_usage"], tier["server_running_max"]
    assert peak >= 0.9 or peak * (running + 1) / running >= 0.95, (peak, running)
    assert tier["verdict"] != "stop: cap"
    err = " ".join(result.err.split())
    assert "with its KV cache full" in err and "the KV cache is the limit, not its cap" in err


def _ladder_passed(root: Path, target: str, batch: int) -> None:
    summary = {"last_passing": {"batch_size": batch, "concurrency": batch}}
    Ledger(root / "runs").append(LedgerEntry("ladder", "test-ladder8", target, True, summary))


def test_the_sweep_never_recommends_above_the_servers_running_cap_nor_pin_writes_it(
    cli, isolated: Path
) -> None:
    """A ladder said batch 8 (as one did before this fix), the server runs 4: the sweep at B=8
    measures 8 in flight, sees 4 running while 4 wait, and recommends at most 4; pin then
    refuses to write a cap of 8 (exit 3). One sweep for both (each ran its own: 5.5 s apiece)."""
    from tests.tier_helpers import PIN_SERVER

    sweep = FAST + "[sweep]\nconcurrency = [1, 2, 4, 8]\nlevel_s = 0.3\nrepeats = 2\n"
    with start_mock(ttft_s=0.03, per_token_s=0.002, slots=4, metrics_style="vllm") as mock:
        target = open_gate(isolated, mock.base_url, sweep + PIN_SERVER, stage="repro")
        _ladder_passed(isolated, target, 8)
        result = cli("sweep", "--json")
        pinned = cli("pin")
    assert result.code == 0, result.err
    out = result.json
    assert out["batch_size"] == 8
    assert out["recommended_concurrency"] <= 4
    assert out["server_limit"]["slots"] == 4
    assert "vllm:num_requests_running peaked at 4" in out["server_limit"]["source"]
    err = " ".join(result.err.split())
    assert "concurrency 8: the server runs at most 4 at once" in err
    assert "left out of the knee" in err
    levels = jsonl(run_dir(isolated, out["run_id"]) / "tiers.jsonl")
    assert max(lv["server_running_max"] for lv in levels) == 4
    assert pinned.code == 3, pinned.err
    err = " ".join(pinned.err.split())
    assert "pin refused" in err and "run at most 4 at once" in err and "calibrate ladder" in err
    assert not (isolated / "scripts/launch.sh").exists()


def test_the_mock_counts_each_prompt_of_a_list_and_says_why_requests_wait() -> None:
    from calibrate.mock import MockModel, MockSettings
    from calibrate.mock.metrics import render_metrics

    settings = MockSettings(slots=4, metrics_style="vllm")
    model = MockModel(settings)
    listed = model.admit(weight=8)  # one /v1/completions request of 8 prompts
    assert model.acquire(listed, timeout_s=1.0)
    snap = model.snapshot()
    assert (snap.running, snap.waiting) == (4, 4), "vLLM counts each prompt as a request"
    text = render_metrics(snap, settings)
    assert 'vllm:num_requests_running{engine="0",model_name="internlm-s2"} 4' in text
    assert 'reason="capacity"} 4' in text and 'reason="deferred"} 0' in text
    model.release(listed)
    assert (model.snapshot().running, model.snapshot().waiting) == (0, 0)


def test_pin_says_when_the_sweep_measured_its_concurrency_above_the_pinned_cap(
    cli, isolated: Path
) -> None:
    """A ladder whose setting is batch 1 while batch 2 passed (its conservative answer under
    noise): the sweep of a server calibrate does not manage goes up to 2 in flight and the
    server ran 2 at once, twice the throughput. pin wrote a cap of 1 and concurrency 2 and said
    nothing — a pair whose gain was measured at a cap it does not set. It says so now, in its
    output and in the script's header."""
    from tests.tier_helpers import PIN_SERVER

    sweep = FAST + "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.3\nrepeats = 2\n"
    with start_mock(ttft_s=0.03, per_token_s=0.002, slots=4, metrics_style="vllm") as mock:
        target = open_gate(isolated, mock.base_url, sweep + PIN_SERVER, stage="repro")
        summary = {"last_passing": {"batch_size": 1, "concurrency": 1}, "max_in_flight": 2}
        Ledger(isolated / "runs").append(
            LedgerEntry("ladder", "test-ladder", target, True, summary)
        )
        swept = cli("sweep", "--json")
        pinned = cli("pin")
    assert swept.code == 0, swept.err
    if swept.json["recommended_concurrency"] != 2:  # the machine's noise hid the gain
        pytest.skip(f"the sweep recommended {swept.json['recommended_concurrency']}, not 2")
    assert pinned.code == 0, pinned.err
    said = " ".join(pinned.err.split())
    assert "concurrency 2 was measured while the server ran up to 2 at once" in said, said
    assert "above this script's cap of 1" in said and "run calibrate sweep again" in said
    header = (isolated / "scripts/launch.sh").read_text()
    assert "# how sure: sweep: concurrency 2 was measured while the server ran up to 2" in header


@pytest.mark.parametrize(("slots", "code"), [(4, 1), (8, 0)])
def test_verify_checks_the_running_servers_cap(cli, isolated: Path, slots: int, code: int) -> None:
    """The setting is batch 8; a server reporting 4 slots (llama.cpp's /props) does not run it."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=slots, expose_props=True) as mock:
        target = open_gate(isolated, mock.base_url, FAST, stage="repro")
        assert cli("single").code == 0
        _ladder_passed(isolated, target, 8)
        result = cli("verify", "--json")
    assert result.code == code, result.err
    err = " ".join(result.err.split())
    assert result.json["server_cap"]["slots"] == slots
    if code:
        assert (
            "the server runs at cap 4 (llama.cpp /props total_slots), not the verified batch 8"
            in err
        )
        assert "config consistent" not in err
    else:
        assert "config consistent at batch 8" in err and "the server's cap is 8" in err


def test_verify_says_when_the_cap_cannot_be_read(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=4, metrics_style="vllm") as mock:
        target = open_gate(isolated, mock.base_url, FAST, stage="repro")
        assert cli("single").code == 0
        _ladder_passed(isolated, target, 4)
        result = cli("verify")
    assert result.code == 0, result.err
    said = " ".join(result.err.split())
    assert "the server's cap is not known (no /props" in said
    assert "config consistent at batch" not in said  # the headline claims only what was checked
    assert "config consistent (the answer; whether it runs at batch 4, concurrency 1" in said


def test_a_slow_metrics_scrape_is_counted_as_slow_end_to_end(cli, isolated: Path) -> None:
    """vLLM's CPU build, taught to the mock (``--metrics-delay-s``): ``/metrics`` answers 0.3 s
    after it is asked, 5 ms apart was asked, the server runs 4 at once and answers in ~50 ms.
    Batch 8 can never be seen running whole: it is not the setting, and the ladder says how far
    apart the samples really came — counted at the 5 ms asked, 50 ms answers would be "seen"."""
    slow = {"metrics_style": "vllm", "metrics_delay_s": 0.3}
    with start_mock(ttft_s=0.01, per_token_s=0.0005, slots=4, **slow) as mock:
        open_gate(isolated, mock.base_url, LADDER)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    tiers = {t["batch_size"]: t for t in result.json["tiers_detail"]}
    assert result.json["last_passing"]["batch_size"] <= 4  # never above what the server ran
    eight = tiers[8]
    assert eight["server_running_max"] <= 4 and eight["metrics_gap_s"] >= 0.1
    said = re.search(r"/metrics samples (\d+) ms apart \(asked: 5 ms\)", eight["running_unseen"])
    assert said and abs(int(said[1]) - eight["metrics_gap_s"] * 1000) <= 1
    err = " ".join(result.err.split())
    if eight["verdict"] == "pass":  # else a sample caught 4 waiting: stop: cap, as it should
        assert f"batch 8 is not the setting: {eight['running_unseen']}" in err
    else:
        assert eight["verdict"] == "stop: cap", eight["verdict"]
    rows = jsonl(run_dir(isolated, result.json["run_id"]) / "tiers.jsonl")
    assert all(row["metrics_gap_s"] >= 0.1 for row in rows)  # each tier's own spacing, kept


def test_a_running_count_sampled_more_slowly_than_the_answers_last_is_unknown() -> None:
    """Seen on real vLLM ``--max-num-seqs 4`` with 10–20 ms answers: /metrics, read every 50 ms,
    never caught a request waiting, and batch 8 was kept and chosen (prompt-list mode). Answers
    shorter than 3 samples whose running count stayed below B leave B unconfirmed — at every
    batch, for every cause the count could stay low for (a cap, or samples between answers)."""
    short = _stats(8, latency_p50_s=0.02, server_running_max=4)
    said = _why(running_unseen(short, 0.05, None))
    assert said.startswith("its answers (p50 20 ms) last less than 3 /metrics samples 50 ms apart")
    assert "showed at most 4 of 8: whether it ran 8 at once is unknown" in said
    assert "[ladder] sample_interval_s" in said and "--output-tokens" in said
    # caught waiting (a full KV cache, seen on real vLLM): it did not run B, said as such
    waited = _why(running_unseen(replace(short, server_queue_max=4), 0.05, None))
    assert waited.endswith("at most 4 of 8 while up to 4 waited: it did not run 8 at once")
    for batch, seen in ((2, 1), (4, 0), (16, 15)):
        assert running_unseen(
            _stats(batch, latency_p50_s=0.02, server_running_max=seen), 0.05, None
        )
    # known: answers of 3 samples or more; the count reached B; one request; no gauge at all;
    # a cap the server reports itself
    assert not running_unseen(replace(short, latency_p50_s=0.15), 0.05, None)
    assert not running_unseen(short, 0.005, None)  # sampled every 5 ms: 4 samples an answer
    assert not running_unseen(replace(short, server_running_max=8), 0.05, None)
    assert not running_unseen(_stats(1, latency_p50_s=0.02, server_running_max=0), 0.05, None)
    assert not running_unseen(replace(short, server_running_max=None), 0.05, None)
    assert not running_unseen(short, 0.05, ServerCap(4, "/props total_slots"))


def test_the_samples_count_as_far_apart_as_they_really_came_never_closer_than_asked() -> None:
    """Seen on vLLM's CPU build ``--max-num-seqs 4``, prompt-list mode: /metrics asked every
    50 ms, answers of 220 ms at batch 8 — "4.4 samples an answer, seen whole" — yet the count
    never showed the cap, because the busy machine read it every 150 ms or so: batch 8 was kept
    against a cap of 4. The rule counts the spacing the tier's samples really had."""
    slow = _stats(8, latency_p50_s=0.22, server_running_max=4, metrics_gap_s=0.15)
    said = _why(running_unseen(slow, 0.05, None))
    assert said.startswith(
        "its answers (p50 220 ms) last less than 3 /metrics samples 150 ms apart (asked: 50 ms)"
    ), said
    # read as often as asked (or the window too short to tell): as before, the interval asked
    assert not running_unseen(replace(slow, metrics_gap_s=0.06), 0.05, None)
    assert not running_unseen(replace(slow, metrics_gap_s=0.01), 0.05, None)
    assert not running_unseen(replace(slow, metrics_gap_s=None), 0.05, None)
    # however slow the samples, a count that reached B, or a cap the server reports, is known
    assert not running_unseen(replace(slow, server_running_max=8), 0.05, None)
    assert not running_unseen(slow, 0.05, ServerCap(4, "/props total_slots"))


def test_a_count_read_through_every_answer_that_never_showed_b_says_b_never_ran() -> None:
    """Seen beside CPU burners (a starved client), and behind any gateway that forwards fewer at
    once: 8 requests, never more than 4 at a 4-slot server at a time, none waiting, samples 38 ms
    apart through answers of 0.52 s — batch 8 ``pass``, the setting but for its speed. Where even
    the shortest answer lasted 3 samples, a count that never showed B is a server that never ran
    B at once; the tier is not the setting."""
    dense = _stats(8, latency_p50_s=0.52, server_running_max=4, server_queue_max=0)
    said = _why(running_unseen(dense, 0.005, None, 0.3), read_through=True)
    assert said.startswith("its running count, read at least 3 times in even its shortest answer")
    assert "(300 ms; samples 5 ms apart), showed at most 4 of 8 and none waited" in said
    assert "the server never ran 8 at once (its requests reached it apart" in said
    # the samples as far apart as they came: 38 ms, still 3 in 0.3 s
    spaced = _why(
        running_unseen(replace(dense, metrics_gap_s=0.038), 0.005, None, 0.3), read_through=True
    )
    assert "samples 38 ms apart (asked: 5 ms)" in spaced and "never ran 8 at once" in spaced
    # no queue gauge: a hidden queue at a cap of 4 is as likely, and it did not run 8 either way
    hidden = _why(
        running_unseen(replace(dense, server_queue_max=None), 0.005, None, 0.3), read_through=True
    )
    assert "it exports no queue gauge: a cap of 4, or requests that reached it apart" in hidden
    # not said: the shortest answer fell between samples (a peak of B could be missed), or is not
    # known (a prompt list's one request); requests waited (the cap rule's, or the KV cache's);
    # the count reached B; a cap the server reports
    assert not running_unseen(replace(dense, metrics_gap_s=0.15), 0.005, None, 0.3)
    assert not running_unseen(dense, 0.005, None, 0.01)
    assert not running_unseen(dense, 0.005, None, None)
    assert not running_unseen(replace(dense, server_queue_max=4), 0.005, None, 0.3)
    assert not running_unseen(replace(dense, server_running_max=8), 0.005, None, 0.3)
    assert not running_unseen(dense, 0.005, ServerCap(4, "/props total_slots"), 0.3)


def test_a_count_read_in_every_answer_waiting_only_while_seating_says_b_never_ran() -> None:
    """Seen beside two CPU burners ([tgi], no KV gauge): batch 8 at a 4-slot mock, running
    at most 4, one request seen waiting only while the server ran 3 (seating another, as each
    request queues on its way to a free slot) — no cap the rule can claim (the wait was a
    ramp's), and batch 8 ``pass`` with nothing said, a setting but for its speed. Read through
    even the shortest answer, a count that never showed 8 is a server that never ran 8 at once,
    whatever waited in passing; the tier is not the setting."""
    ramp = _stats(
        8, latency_p50_s=0.52, server_running_max=4, server_queue_max=1, running_while_queued=3
    )
    assert observed_cap(ramp) is None, "a wait seen only while seating is no cap"
    said = _why(running_unseen(ramp, 0.005, None, 0.3), read_through=True)
    assert "(300 ms; samples 5 ms apart), showed at most 4 of 8: the server never ran 8" in said
    assert "a request waited only while it ran 3 (seating the others): a cap of 4" in said
    # read too sparsely to tell, or a cap the rule claims (waited while 4 ran): as before
    assert not running_unseen(ramp, 0.005, None, 0.01)
    assert not running_unseen(replace(ramp, running_while_queued=4), 0.005, None, 0.3)


def test_a_gateway_that_forwards_four_at_once_never_makes_batch_8_the_setting(
    cli, isolated: Path
) -> None:
    """End to end: an 8-slot server behind a gateway that lets 4 completions through at once
    (the rest held where the server cannot count them, as a starved client holds them). The
    server's running count, read through every answer, never showed 8 and nothing waited: batch 8
    is not the setting, and the ladder says why."""
    server = {"ttft_s": 0.15, "per_token_s": 0.001, "slots": 8, "metrics_style": "vllm"}
    with start_mock(**server) as mock, FrontProxy(mock.base_url, lanes=4) as gateway:
        open_gate(isolated, gateway.base_url, LADDER)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    tiers = {t["batch_size"]: t for t in result.json["tiers_detail"]}
    eight = tiers[8]
    assert eight["server_running_max"] <= 4 and not eight["server_queue_max"], eight
    assert result.json["last_passing"]["batch_size"] <= 4
    err = " ".join(result.err.split())
    assert eight["verdict"] == "pass", eight
    (records,) = (isolated / "runs").glob("*-ladder-*/records.jsonl")
    answers = [r["elapsed_s"] for r in jsonl(records) if r["batch_size"] == 8 and r["ok"]]
    # even its shortest answer read 3 times: 0.15 s at least, longer when the gateway or a busy
    # machine held some (seen: 271 ms answers, samples 62 ms apart)
    if eight["metrics_gap_s"] * SAMPLES_PER_ANSWER <= min(answers):
        assert "the server never ran 8 at once" in eight["running_unseen"], eight
    else:  # a machine so busy its samples came further apart: unknown, and said so
        assert "whether it ran 8 at once is unknown" in eight["running_unseen"], eight
    assert f"batch 8 is not the setting: {eight['running_unseen']}" in err


class _RunningGauge:
    """A /metrics that says 4 running, read on a clock the test moves."""

    source = "metrics"

    def __init__(self, clock: list[float], step_s: float) -> None:
        self.clock, self.step_s = clock, step_s

    def read(self) -> VramReading:
        self.clock[0] += self.step_s  # each read takes this long
        return VramReading(
            "metrics", server_running=4.0, running_metric="vllm:num_requests_running"
        )

    def close(self) -> None:
        pass


def test_a_window_knows_how_often_its_running_count_was_read_and_the_row_keeps_it() -> None:
    now = [100.0]
    monitor = VramMonitor([_RunningGauge(now, 0.15)], 0.05, clock=lambda: now[0])
    idle = monitor.open_window()
    monitor.sample()
    monitor.sample()
    peak = monitor.close_window(idle)
    assert peak.running is not None and peak.running.gap_s == pytest.approx(0.15)
    stats = summarise(
        batch_size=8, concurrency=8, round_no=None, items=[], total_s=1.0, peaks=[peak],
        baseline_text=None,
    )  # fmt: skip
    assert stats.metrics_gap_s == pytest.approx(0.15)
    assert row_json(stats.row())["metrics_gap_s"] == pytest.approx(0.15)
    # a server without a running gauge: no column at all, as in the runs written before
    assert "metrics_gap_s" not in row_json(replace(stats, metrics_gap_s=None).row())


def test_a_ladder_never_sets_a_batch_its_running_count_could_not_show_it_ran(
    cli, isolated: Path
) -> None:
    """Answers of ~10 ms, /metrics read every 50 ms, one wave a tier: the running count catches
    little of any wave, whatever the server's slots (4: a cap; 8: none). The setting is never
    above the most the server was seen running, and each kept tier above what its count showed
    says why it is not the setting and how to see more."""
    config = LADDER.replace("sample_interval_s = 0.005", "sample_interval_s = 0.05")
    for slots in (4, 8):
        with start_mock(ttft_s=0.004, per_token_s=0.0002, slots=slots) as mock:
            open_gate(isolated, mock.base_url, config)
            result = cli("ladder", "--json")
        assert result.code == 0, result.err
        tiers = result.json["tiers_detail"]
        seen = max(t["server_running_max"] for t in tiers)
        assert seen <= slots
        assert result.json["last_passing"]["batch_size"] <= max(1, seen), tiers
        err = " ".join(result.err.split())
        for tier in tiers:
            batch = tier["batch_size"]
            if tier["verdict"] == "pass" and seen < batch >= 2:  # no tier showed B running
                assert tier["running_unseen"].startswith("its answers (p50 "), tier
                assert f"batch {batch} is not the setting: its answers (p50" in err


def test_a_managed_server_beside_the_target_says_nothing_of_the_targets_cap(
    cli, isolated: Path
) -> None:
    """The target reports 4 slots; a server calibrate manages runs beside it on another port,
    started from a script that says batch 8. Its record is no account of the target: verify
    read the cap there (8, "config consistent", exit 0), and the ladder's cap and the sweep's
    restart at cap B would have meant that other server too. Only a managed server the target
    points at (this machine, its port) is the target's."""
    other = free_port()
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=4, expose_props=True) as mock:
        target = open_gate(isolated, mock.base_url, FAST, stage="repro")
        assert cli("single").code == 0
        _ladder_passed(isolated, target, 8)
        script = isolated / "scripts/other.sh"
        script.parent.mkdir(exist_ok=True)
        script.write_text(
            "#!/usr/bin/env bash\n# kind: vllm\nset -euo pipefail\n"
            f"export PORT={other}\nexport BATCH_SIZE=8\nexport MAX_CONCURRENCY=8\n"
            f"exec {mock_command('--expose-props')} \n".replace("{port}", str(other)).replace(
                "{concurrency}", "8"
            ),
            encoding="utf-8",
        )
        started = cli("server", "start", "--script", str(script))
        assert started.code == 0, started.err
        try:
            result = cli("verify", "--json")
            cfg = config.load(config.Overrides(config_path=str(isolated / "calibrate.toml")), {})
            record = process.load(isolated / "runs")
            beside = [
                managed_target(replace(cfg, target=replace(cfg.target, base_url=url)))
                for url in (
                    f"http://localhost:{other}/v1",
                    f"http://[::1]:{other}/v1",
                    f"http://127.0.0.1:{other + 1}/v1",
                    f"http://10.1.2.3:{other}/v1",
                )
            ]
            theirs = managed_target(cfg)
            at_it = replace(
                cfg, target=replace(cfg.target, base_url=f"http://127.0.0.1:{other}/v1")
            )
            kinds = (running_kind(cfg), running_kind(at_it))  # the engine's kind
        finally:
            assert cli("server", "stop").code == 0
    assert result.code == 1, result.err
    err = " ".join(result.err.split())
    assert (
        "the server runs at cap 4 (llama.cpp /props total_slots), not the verified batch 8" in err
    )
    assert theirs is None and record is not None and beside == [record, record, None, None]
    assert kinds == (None, "vllm"), "the engine beside is not the target's engine (pin's kind)"
