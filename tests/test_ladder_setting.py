"""The ladder's numbers a user acts on, over real HTTP against the real mock: the canary outside
the measured waves, the setting as the best kept tier (status and pin use it), stop: preempt from
the server's own counter, stop: cap above the server's own cap (SPEC §5.3)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import (
    DEFAULT_RISE,
    FAST,
    assert_ladder_ran,
    jsonl,
    open_gate,
    run_dir,
    setting_by_rule,
)

SERVER = '[server]\nkind = "vllm"\nmodel_path = "/models/m1"\nport = 8123\n'


def _gate_with_baseline(cli, root: Path, base_url: str, extra: str) -> None:
    """single (the baseline the canary is compared with) and repro, as a user would."""
    write_config(root / "calibrate.toml", base_url, extra)
    assert cli("single").code == 0
    assert cli("repro", "--runs", "1").code == 0


@pytest.mark.parametrize("batch_sizes", ["[1, 2]", "[1, 4]"])
def test_the_canary_is_sent_alone_between_measured_waves(
    cli, isolated: Path, batch_sizes: str
) -> None:
    """With a synthetic workload the fixed prompt (a longer answer) must not set a wave's time:
    batch 1's time per item is the items' own latency, and concurrency is what was in flight."""
    with start_mock() as mock:  # the mock's defaults, as in the issue: items of ~0.25 s
        extra = FAST + f"batch_sizes = {batch_sizes}\n"
        _gate_with_baseline(cli, isolated, mock.base_url, extra)
        result = cli("ladder", "--input-tokens", "100", "--output-tokens", "20", "--json")
    assert result.code == 0, result.err
    first = result.json["tiers_detail"][0]
    assert first["batch_size"] == 1 and first["concurrency"] == 1
    # before: 0.537 s per item against 0.252 s of latency (the canary's 48-token answer); a
    # wave of one lasts its request and the client's own time around it (+10 % beside four CPU
    # burners), never the canary's on top
    assert first["latency_mean_s"] <= first["per_item_s"] * 1.01
    assert first["per_item_s"] < 1.5 * first["latency_mean_s"]
    assert first["output_tokens_mean"] == 20, "the canary's answer is not a workload item"
    records = jsonl(run_dir(isolated, result.json["run_id"]) / "records.jsonl")
    canaries = [r for r in records if r.get("canary")]
    work = [r for r in records if not r.get("canary")]
    tiers = result.json["tiers_detail"]
    assert len(canaries) == sum(t["rounds"] for t in tiers), "one canary a round"
    assert all(r["concurrency"] == 1 and r["canary"] is True for r in canaries)
    assert all(r["concurrency"] == r["batch_size"] for r in work)
    for tier in tiers:  # each round's measured items are exactly B per wave
        assert tier["items"] == tier["batch_size"] * tier["waves"]
        assert tier["baseline_items"] == tier["rounds"], "the canaries are still compared"
        assert tier["baseline_match"] == tier["rounds"]


def test_a_slower_stop_latency_tier_never_becomes_the_setting(cli, isolated: Path) -> None:
    """batch 4 is slowed 4× per token (each item twice batch 2's): it stops there at the
    latest, kept as stop: latency, but the setting (ledger, status, pin) is a tier below it —
    the one the ladder's own rule takes from its rounds — and the ladder says why. Which tier
    stopped is the run's own measurement: the rule's thresholds are tested on scripted waves
    (tests/stages/ladder/test_fast.py, test_rules.py), where a busy machine cannot move them.
    So is how sure the ladder is of the rest: beside CPU burners the client was the limit (exit
    1, or with --conservative the smaller tier, taken and said so), or the rounds put the stop
    tier's slowness "within the rounds' noise" — the stop tier is never the setting either way."""
    with start_mock(ttft_s=0.002, per_token_s=0.002, slow_above=2, slow_factor=4.0) as mock:
        open_gate(isolated, mock.base_url, DEFAULT_RISE + SERVER)
        result = cli("ladder", "--json")
    assert_ladder_ran(result)  # exit 0, or 1: the client was the limit from batch N on
    tiers = result.json["tiers"]
    verdicts = [t["verdict"] for t in tiers]
    stop = verdicts.index("stop: latency")
    assert verdicts == ["pass"] * stop + ["stop: latency"] and 1 <= stop <= 2, result.err
    stopped = tiers[stop]["batch_size"]
    assert result.json["highest_kept"] == stopped
    if result.code == 1:  # no kept tier measured the server: no setting at all, none above
        assert result.json["last_passing"] is None, result.err
        return
    setting = result.json["last_passing"]["batch_size"]
    assert setting < stopped, result.err
    assert setting == setting_by_rule(run_dir(isolated, result.json["run_id"]))
    reason = result.json["setting_reason"]
    assert reason.startswith(f"batch {setting}"), reason
    # what it says of the stop tier: "batch 4 kept but 45 % slower, and each item cost more
    # there (stop: latency)" (or "… slower by the medians, within the rounds' noise (…), and …",
    # or "… faster …, under the 10 % …" over a conservative batch 1), or that calibrate was the
    # limit there
    said = next(p for p in reversed(reason.split("; ")) if p.startswith(f"batch {stopped} "))
    if result.json["tiers_detail"][stop]["client_bound"]:
        assert said == f"batch {stopped} not judged: calibrate itself was the limit there", reason
    else:
        assert " kept but " in said or " faster " in said, reason
        assert said.endswith("(stop: latency)") or "(stop: latency): " in said, reason
    assert (
        f"setting: batch {setting}, concurrency 1 (no sweep at this batch size yet) — {reason}"
        in result.err
    )
    _status_and_pin_say(cli, isolated, setting)


@pytest.mark.parametrize("conservative", [False, True])
def test_a_tier_over_an_slo_while_the_client_was_the_limit_is_no_boundary(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, conservative: bool
) -> None:
    """One slot, ~0.5 s answers: batch 4's first tokens wait for the slot (its p99 ~1.5 s), over
    a 0.75 s SLO that batch 1's (10 ms, 0.35 s once beside two CPU burners) stays under;
    calibrate's self-check says the client was the limit during batch 4 (the monitor's answer
    made certain here, as a busy machine gives it at random). Its p99s were timed by a starved
    client: no boundary — inconclusive (exit 1) with what to do, or with ``--conservative``
    batch 1 taken and said so. (The rule itself: tests/stages/ladder/test_rules.py.)"""
    from calibrate.gpu.selfload import SelfLoadMonitor

    starved = "calibrate's own process used 0.99 CPU cores"
    tiers = itertools.count(1)  # the ladder asks once a tier, after it ran
    monkeypatch.setattr(
        SelfLoadMonitor, "bound_since", lambda self, mark: starved if next(tiers) == 2 else ""
    )
    ladder = FAST if conservative else FAST.replace("conservative = true", "conservative = false")
    config = ladder + "batch_sizes = [1, 4]\n[slo]\nttft_p99_s = 0.75\n"
    with start_mock(ttft_s=0.01, per_token_s=0.01, slots=1) as mock:
        open_gate(isolated, mock.base_url, config)
        result = cli("ladder", "--json")
    detail = result.json["tiers_detail"]
    assert [(t["verdict"], t["client_bound"]) for t in detail] == [
        ("pass", None),
        ("stop: slo", starved),
    ], result.err
    why = "the client was the limit at batch 4, the tier over an SLO"
    if conservative:
        assert result.code == 0 and result.json["last_passing"]["batch_size"] == 1, result.err
        reason = result.json["setting_reason"]
        assert reason.startswith(f"batch 1, the conservative answer, taken (--conservative): {why}")
        assert "batch 4 not kept: over an SLO, calibrate itself the limit there" in reason
    else:
        assert result.code == 1 and result.json["last_passing"] is None, result.err
        assert f"ladder inconclusive: {why}" in result.err
        assert "or take the conservative answer (batch 1) with --conservative" in result.err


def test_a_preempting_tier_is_stop_preempt_with_counts_and_not_kept(cli, isolated: Path) -> None:
    """The mock preempts when its KV cache is full (``--on-kv-full preempt``) and counts it as
    vLLM does; batch 8 does not fit in 400 tokens of KV: stop: preempt, batch 4 is the setting."""
    with start_mock(
        ttft_s=0.002,
        per_token_s=0.002,
        kv_capacity_tokens=400,
        kv_mib_per_1k_tokens=100,
        on_kv_full="preempt",
    ) as mock:
        open_gate(isolated, mock.base_url, FAST + SERVER)
        result = cli("ladder", "--json")
        metrics = mock.model.snapshot()
    assert result.code == 0, result.err
    assert [t["verdict"] for t in result.json["tiers"]] == ["pass"] * 3 + ["stop: preempt"]
    assert result.json["stopped_by"] == "preempt"
    detail = result.json["tiers_detail"]
    assert [t["preemptions"] for t in detail[:3]] == [0, 0, 0]
    counted = detail[3]["preemptions"]
    assert counted and counted == metrics.preemptions_total
    assert detail[3]["preemption_metric"] == "vllm:num_preemptions_total"
    assert f"batch 8: the server preempted {counted} requests during the tier" in result.err
    setting = result.json["last_passing"]  # 4, or 2 when one wave each left 4's gain in the noise
    assert setting["concurrency"] == setting["batch_size"]
    if setting["batch_size"] == 1:  # a machine so busy that calibrate itself or its noise set it
        starved = any(t["client_bound"] for t in detail[1:3])
        assert starved or result.json.get("under_noise"), result.json["setting_reason"]
    else:
        assert setting["batch_size"] in (2, 4), result.json["setting_reason"]
    assert result.json["max_in_flight"] == 4, "a preempting tier is not kept"
    assert "batch 8 not kept: the server preempted" in result.json["setting_reason"]
    _status_and_pin_say(cli, isolated, setting["batch_size"])  # whichever the ladder chose


def test_the_mock_exposes_its_preemption_counter_as_vllm_names_it() -> None:
    import urllib.request

    with start_mock(kv_capacity_tokens=100, on_kv_full="preempt") as mock:
        root = mock.base_url.removesuffix("/v1")
        text = urllib.request.urlopen(root + "/metrics", timeout=10).read().decode()
    assert "# TYPE vllm:num_preemptions_total counter" in text
    assert 'vllm:num_preemptions_total{model_name="internlm-s2"} 0' in text
    with start_mock(kv_capacity_tokens=100, on_kv_full="oom") as mock:
        root = mock.base_url.removesuffix("/v1")
        text = urllib.request.urlopen(root + "/metrics", timeout=10).read().decode()
    assert "num_preemptions" not in text, "only a preempting mock counts preemptions"


@pytest.mark.parametrize(("slots", "kept"), [(2, [1, 2]), (4, [1, 2, 4])])
def test_tiers_above_the_servers_own_cap_are_stop_cap(
    cli, isolated: Path, slots: int, kept: list[int]
) -> None:
    """A llama.cpp-like server reporting ``total_slots`` in /props: above it the tier measured
    the server's queue, not batch B — stop: cap, not kept, and said so."""
    with start_mock(ttft_s=0.002, per_token_s=0.002, slots=slots, expose_props=True) as mock:
        open_gate(isolated, mock.base_url, FAST)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    verdicts = [(t["batch_size"], t["verdict"]) for t in result.json["tiers"]]
    assert verdicts == [(b, "pass") for b in kept] + [(slots * 2, "stop: cap")]
    assert result.json["stopped_by"] == "cap"
    assert result.json["max_in_flight"] == slots
    assert f"the server's own cap: {slots} (llama.cpp /props total_slots)" in result.err
    assert f"batch {slots * 2}: the server's own cap is {slots}" in result.err
    assert result.json["last_passing"]["batch_size"] <= slots


def _status_and_pin_say(cli, root: Path, batch: int) -> None:
    """``status`` and ``pin`` take the ladder's setting, not its last tier."""
    status = cli("status", "--json")
    assert status.code == 0, status.err
    assert status.json["setting"]["batch_size"] == batch
    assert status.json["setting"]["source"] == "ladder"
    assert f"calibrated setting: batch {batch}," in cli("status").err
    pin = cli("pin", "--json")
    assert pin.code == 0, pin.err
    assert f"--max-num-seqs {batch}" in (root / "scripts/launch.sh").read_text("utf-8")


def _fake_llama_server(bin_dir: Path) -> Path:
    """``llama-server`` on PATH: the mock, with as many slots as ``--parallel`` says (and /props
    saying so), and its argv appended to ``argv.log`` beside it."""
    import stat
    import sys

    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> "{bin_dir}/argv.log"\n'
        'port=""; slots=1\n'
        "while [ $# -gt 0 ]; do\n"
        '  case "$1" in --port) port=$2; shift;; --parallel) slots=$2; shift;; esac; shift\n'
        "done\n"
        f'exec "{sys.executable}" -m calibrate mock --port "$port" --slots "$slots" '
        "--ttft 0.002 --per-token 0.001 --expose-props --metrics-style llamacpp\n",
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def _managed_fake_llamacpp(
    root: Path, monkeypatch: pytest.MonkeyPatch, config_kind: str, extra: str
) -> Path:
    """The fake ``llama-server`` on PATH and a config whose [server] names ``config_kind``;
    the fake's folder (its ``argv.log``)."""
    import os

    from tests.fakes import free_port, pythonpath_env

    bin_dir = _fake_llama_server(root / "fakebin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    port = free_port()
    server = (
        f'[server]\nkind = "{config_kind}"\nmodel_path = "/models/m.gguf"\nport = {port}\n'
        "ready_timeout_s = 20\nstop_timeout_s = 5\n"
    )
    write_config(root / "calibrate.toml", f"http://127.0.0.1:{port}/v1", extra + server)
    return bin_dir


def _ladder_on_managed(cli: Any, *start: str) -> Any:
    """``server start --batch-size 1 START…``, single, repro, the ladder (--json), stop."""
    started = cli("server", "start", "--batch-size", "1", *start)
    assert started.code == 0, started.err
    try:
        assert cli("single").code == 0 and cli("repro", "--runs", "1").code == 0
        result = cli("ladder", "--json")
    finally:
        cli("server", "stop")
    assert result.code == 0, result.err
    return result


def _started_parallel(bin_dir: Path) -> list[str]:
    """The --parallel of each start of the fake llama-server, in order."""
    lines = (bin_dir / "argv.log").read_text("utf-8").splitlines()
    return [line.split("--parallel ")[1].split()[0] for line in lines]


def test_a_managed_llamacpp_ladder_restarts_at_parallel_b_for_each_tier(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For llama.cpp the batch size is ``--parallel``: calibrate restarts the engine it manages
    at --parallel B before each tier (no stop: cap), and pin carries the setting's --parallel."""
    bin_dir = _managed_fake_llamacpp(isolated, monkeypatch, "llamacpp", FAST)
    result = _ladder_on_managed(cli, "--concurrency", "1")
    assert [t["verdict"] for t in result.json["tiers"]] == ["pass"] * 4, "no stop: cap"
    parallel = _started_parallel(bin_dir)
    # started at 1, then one restart per tier above it (and per round again of another B, where
    # the setting needed more rounds to tell two tiers apart on a busy machine)
    assert parallel[:4] == ["1", "2", "4", "8"], parallel
    assert all(a != b for a, b in itertools.pairwise(parallel)), "never a needless one"
    assert "restarting the managed server at cap 8 (--parallel 8 for ladder batch 8)" in result.err
    batch = result.json["last_passing"]["batch_size"]
    assert batch == setting_by_rule(run_dir(isolated, result.json["run_id"]))
    tiers = result.json["tiers"]
    if "the conservative answer, taken" not in result.err and not any(
        t.get("client_bound") for t in tiers
    ):
        # 1 slot per B: throughput doubles up to the setting (a machine so busy that its rounds
        # cannot tell 2× apart takes, and says, the conservative answer instead: FAST)
        assert batch in (4, 8), result.err
    assert cli("pin").code == 0
    assert f"--parallel {batch}" in (isolated / "scripts/launch.sh").read_text("utf-8")


def test_a_server_started_as_another_kind_than_the_config_says_is_treated_as_what_runs(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``server start --kind llamacpp`` under a config that names vllm: what runs is llama.cpp,
    so the ladder restarts it at --parallel B per tier (one rule for the kind, ``kind_of``; the
    cap reader once took the config's vllm and measured one --parallel for every tier), and
    pin, after the server is stopped, writes the llama.cpp script the numbers hold for."""
    bin_dir = _managed_fake_llamacpp(
        isolated, monkeypatch, "vllm", FAST + "batch_sizes = [1, 2, 4]\n"
    )
    result = _ladder_on_managed(cli, "--kind", "llamacpp")
    pinned = cli("pin")  # the server is gone: the ladder's manifest says what was measured
    assert pinned.code == 0, pinned.err
    script = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "llama-server" in script and "--parallel" in script and "--max-num-seqs" not in script
    assert _started_parallel(bin_dir)[:3] == ["1", "2", "4"], "one restart per tier above 1"
    assert [t["verdict"] for t in result.json["tiers"]] == ["pass"] * 3
    run = isolated / "runs" / result.json["run_id"]
    assert json.loads((run / "manifest.json").read_text("utf-8"))["server_kind"] == "llamacpp"
