"""tune's pure parts: default axes per engine kind, --grid, the builders' tuned flags, the
halving schedule, ranking, and the resolver taking a tune winner (no server started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.engines.builders import LaunchSpec, build
from calibrate.errors import ConfigError, UsageError
from calibrate.stages.tune.grid import Candidate, build_plan
from calibrate.stages.tune.outcome import rank
from calibrate.stages.tune.result import BestLevel, CandidateResult, Measurement
from calibrate.stages.tune.search import schedule
from calibrate.state.ledger import Ledger, LedgerEntry
from calibrate.state.setting import resolve


def plan(kind: str, batch: int = 8, *grid: str, placeholders: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    return build_plan(
        kind,
        batch,
        config_grid=(),
        cli_grid=grid,  # type: ignore[arg-type]
        memory_fractions=(0.95, 0.9),
        placeholders=placeholders,
        ctx_per_slot=300,
    )


def test_default_axes_follow_the_ladders_batch_size() -> None:
    vllm = plan("vllm", 8)
    assert [(a.key, a.values) for a in vllm.axes] == [
        ("max_num_seqs", ("4", "8", "16")),
        ("max_num_batched_tokens", ("2048", "4096", "8192", "16384")),
    ]
    assert vllm.size == 12 and vllm.memory_key == "gpu_memory_utilization"
    probe = vllm.probe("0.95")
    assert probe.flags[-1] == ("gpu_memory_utilization", "0.95") and probe.cap == 16
    llama = plan("llamacpp", 2)
    assert llama.axes[0].values == ("1", "2", "4") and llama.memory_key is None
    assert [c.flags for c in llama.candidates()][2] == (("parallel", "4"), ("ctx_size", "1200"))
    assert [c.cap for c in llama.candidates()] == [1, 2, 4]
    assert plan("vllm", 1).axes[0].values == ("1", "2")
    assert plan("sglang", 4).memory_key == "mem_fraction_static"
    for kind in ("lmdeploy", "tgi", "ollama"):
        assert plan(kind, 4).size >= 3


def test_grid_replaces_an_axis_and_refuses_what_is_not_a_flag() -> None:
    p = plan("vllm", 8, "max_num_batched_tokens=8192", "max_num_seqs=8,32")
    assert [a.values for a in p.axes] == [("8", "32"), ("8192",)]
    assert plan("vllm", 8, "gpu_memory_utilization=0.9,0.8").memory_key is None
    for bad, said in [
        ("nope=1", "not a tunable vllm flag"),
        ("max_num_seqs=4,$(reboot)", "not allowed"),
        ("max_num_seqs", "KEY=V1,V2"),
        ("max_num_seqs=0", "whole numbers"),
        ("max_num_seqs=--api-key", "not allowed"),
    ]:
        with pytest.raises(UsageError, match=said):
            plan("vllm", 8, bad)
    with pytest.raises(UsageError, match="nothing to tune"):
        plan("custom", 4, placeholders=("port", "slots"))
    with pytest.raises(UsageError, match=r"no \{kv\} placeholder"):
        plan("custom", 4, "kv=1", placeholders=("port", "slots"))
    with pytest.raises(UsageError, match="at most 256"):
        plan(
            "vllm",
            8,
            *(
                f"{k}={','.join(map(str, range(1, 20)))}"
                for k in ("max_num_seqs", "max_num_batched_tokens")
            ),
        )
    custom = plan("custom", 4, "slots=1,2", placeholders=("port", "slots", "memory_fraction"))
    assert custom.memory_key == "memory_fraction" and custom.candidates("0.9")[1].flags == (
        ("slots", "2"),
        ("memory_fraction", "0.9"),
    )


def test_builders_write_the_tuned_flags_as_argv_elements() -> None:
    def argv(kind: str, tuned: tuple[tuple[str, str], ...], **kw: object) -> list[str]:
        spec = LaunchSpec(kind, "/m", 8000, batch_size=4, concurrency=4, tuned=tuned, **kw)  # type: ignore[arg-type]
        return list(build(spec).argv)

    vllm = argv(
        "vllm",
        (
            ("max_num_seqs", "4"),
            ("max_num_batched_tokens", "8192"),
            ("gpu_memory_utilization", "0.85"),
        ),
    )
    assert vllm[-6:] == [
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "8192",
        "--gpu-memory-utilization",
        "0.85",
    ]
    assert vllm.count("--max-num-seqs") == 1
    llama = argv("llamacpp", (("parallel", "4"), ("ctx_size", "2048"), ("ubatch", "256")))
    assert llama[-7:] == ["--parallel", "4", "-c", "2048", "-ub", "256", "--metrics"]
    assert "--mem-fraction-static" in argv("sglang", (("mem_fraction_static", "0.8"),))
    assert "--cache-max-entry-count" in argv("lmdeploy", (("cache_max_entry_count", "0.5"),))
    assert "--max-batch-total-tokens" in argv("tgi", (("max_batch_total_tokens", "8192"),))
    with pytest.raises(ConfigError, match="not a tunable"):
        argv("vllm", (("parallel", "4"),))
    command = "srv --port {port} --slots {slots} --kv {kv_tokens} sh -c 'echo ${HOME} {slots}'"
    custom = argv("custom", (("slots", "4"), ("kv_tokens", "9000")), command=command)
    assert custom[:7] == ["srv", "--port", "8000", "--slots", "4", "--kv", "9000"]
    assert custom[-1] == "echo ${HOME} 4", "a shell's own ${VAR} is not a placeholder"
    hostile = argv("custom", (("slots", "4; touch /tmp/x"),), command="sh -c 'srv {slots}'")
    assert hostile[-1] == "srv '4; touch /tmp/x'", "values are shell-quoted where a shell parses"
    with pytest.raises(UsageError, match=r"uses \{slots\}") as unknown:
        argv("custom", (), command="srv --slots {slots}")
    assert "calibrate tune" in (unknown.value.hint or "")


def test_halving_schedule_halves_the_field_and_doubles_the_window() -> None:
    assert schedule(12, "grid") == [(12, 1.0)]
    assert schedule(12, "halving") == [(12, 0.125), (6, 0.25), (3, 0.5), (2, 1.0)]
    assert schedule(3, "halving") == [(3, 0.5), (2, 1.0)]
    assert schedule(2, "halving") == [(2, 1.0)]


def _result(
    index: int, goodput: float | None, *, started: bool = True, rung: int = 0, crashed: bool = False
) -> CandidateResult:
    best = BestLevel(4, goodput, goodput, 100.0, 0.1, 0.2, None) if goodput else None
    m = Measurement(best, (), 0, 0, None, None, None, "none", "completed") if started else None
    return CandidateResult(
        Candidate(index, (("slots", str(index)),), 4),
        rung,
        1.0,
        started,
        None if started else 1,
        "",
        (),
        served=started,
        crashed=crashed,
        measurement=m,
    )


def test_rank_puts_healthy_later_rungs_and_higher_goodput_first() -> None:
    ranked = rank(
        [
            _result(1, 5.0),
            _result(2, None, started=False),
            _result(3, 9.0, crashed=True),
            _result(4, 7.0),
            _result(5, 6.0, rung=1),
        ]
    )
    assert [r.candidate.index for r in ranked] == [5, 4, 1, 3, 2]
    again = CandidateResult.from_json(ranked[0].to_json())
    assert again is not None and again.to_json() == ranked[0].to_json()
    assert _result(2, None, started=False).status == "did not start"


def test_the_resolver_takes_the_newest_tune_winner(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ladder = {"last_passing": {"batch_size": 4, "concurrency": 4}, "stopped_by": "vram"}
    ledger.append(LedgerEntry("ladder", "r-ladder", "t", True, ladder))
    winner = {"batch_size": 8, "concurrency": 6, "flags": {"max_num_seqs": "8", "x": "1"}}
    ledger.append(LedgerEntry("tune", "r-tune", "t", True, {"winner": winner, "complete": True}))
    found = resolve(ledger, "t")
    assert found is not None and found.set_by == "tune" and found.setting.batch_size == 8
    assert found.concurrency == 6 and found.tuned == (("max_num_seqs", "8"), ("x", "1"))
    assert found.tuned_by == "tune run r-tune"
    ledger.append(LedgerEntry("tune", "r-tune2", "t", False, {"winner": None}, interrupted=True))
    assert resolve(ledger, "t") == found, "an interrupted tune sets nothing"
    ledger.append(
        LedgerEntry("sweep", "r-sweep", "t", True, {"recommended_concurrency": 2, "batch_size": 4})
    )
    newer = resolve(ledger, "t")
    assert newer is not None and newer.set_by == "sweep" and newer.tuned == ()
