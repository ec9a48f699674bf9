"""The determinism report (SPEC §13): copies of the fixed prompt per tier and level, compared."""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path

import pytest

from calibrate.config import Config
from calibrate.mock import text
from calibrate.mock.settings import MockSettings
from calibrate.stages.determinism import (
    across,
    check,
    copies_per_wave,
    engine_switch,
    first_difference,
    judge_determinism,
    overall,
    tokens,
)
from tests.helpers import write_config
from tests.mockserver import start_mock, start_mock_process
from tests.tier_helpers import FAST, assert_ladder_ran, jsonl, open_gate, run_dir

A = "Arrays hold a fixed number of elements of one type."


@pytest.mark.parametrize(
    ("a", "b", "at"),
    [
        (A, A, None),
        (A, A.replace("fixed", "given"), 4),
        (A, "Lists" + A[6:], 1),
        (A, A[: A.index(" of one")], 8),  # b is a's prefix: b ends before token 8
        (A, A.replace(" of one", "  of one"), 8),  # whitespace alone differs at token 8
        ("定长数组是一种结构。", "定长数组是两种结构。", 6),  # one CJK character is one token
    ],
)
def test_first_difference_is_the_1_based_token_where_the_texts_part(
    a: str, b: str, at: int | None
) -> None:
    assert first_difference(a, b) == at
    assert first_difference(b, a) == at
    assert "".join(tokens(a)) == a


def test_check_counts_distinct_completions_and_names_the_earliest_variant() -> None:
    late = A.replace("type", "kind")
    early = A.replace("hold", "keep")
    found = check([A, A, late, A, early, None, A, A], in_flight=4)
    assert (found.copies, found.answered, found.distinct, found.counts) == (8, 7, 3, (5, 1, 1))
    assert found.divergence is not None and found.divergence.token == 2
    assert "hold" in found.divergence.common and "keep" in found.divergence.variant
    line = found.describe("batch 4")
    assert line.startswith("batch 4: 3 distinct completions of 8 (1 unanswered); first difference")
    assert "at token 2" in line
    same = check([A] * 8, in_flight=1)
    assert same.distinct == 1 and same.divergence is None
    assert same.describe("batch 1") == "batch 1: 8 of 8 copies identical"
    assert same.to_json()["first_diff_token"] is None
    assert check([None, None], 2).distinct == 0


def test_copies_that_failed_are_no_agreement() -> None:
    """Answers alike of fewer copies than were sent establish nothing: 2 of 8 answering alike
    read "identical", deterministic true, and --require-match passed (SPEC §5.14)."""
    few = check([A, None, None, A, None, None, None, None], in_flight=2)
    assert few.deterministic is None and few.divergence is None
    assert (
        few.describe("batch 2") == "batch 2: 2 answered alike, 6 of 8 unanswered — not established"
    )
    assert check([None, None], 2).describe("batch 2").startswith("batch 2: none answered")
    assert check([A] * 8, 1).deterministic is True
    assert check([A, A.replace("one", "a"), None], 3).deterministic is False  # a difference is one
    line = overall([("batch 1", check([A] * 8, 1)), ("batch 2", few)])
    assert line == (
        "determinism (8 copies each): identical at batch 1; "
        "not established at batch 2 (6 of 8 unanswered)"
    )
    found = judge_determinism(Config(), [("batch 1", check([A] * 8, 1)), ("batch 2", few)])
    assert found is not None and found.to_json()["deterministic"] is None


def test_tiers_each_alike_but_not_as_each_other_differ() -> None:
    """Every copy at batch 1 alike, every copy at batch 4 alike, the two answers not the same:
    "identical at batch 1, batch 4" and deterministic — the answer changed with the batch."""
    batched = A.replace("hold", "keep")
    checks = [("batch 1", check([A] * 8, 1)), ("batch 4", check([batched] * 8, 4))]
    line = overall(checks)
    assert line == (
        "determinism (8 copies each): identical at batch 1, batch 4; how many the server ran "
        "at once is not known at batch 4; but batch 1 and batch 4 answer differently (first "
        "difference at token 2)"
    )
    found = judge_determinism(Config(), checks)
    assert found is not None and found.to_json()["deterministic"] is False
    alike = [("batch 1", check([A] * 8, 1)), ("batch 4", check([A] * 8, 4))]
    assert "differently" not in (overall(alike) or "")


def test_two_sets_each_alike_but_not_as_each_other_differ() -> None:
    """Copies one after another all alike and copies at once all alike, but not the same answer:
    the answer changes with the load — each set's own check cannot see it."""
    batched = A.replace("hold", "keep")
    one, many = check([A] * 4, 1), check([batched] * 4, 4)
    assert one.deterministic and many.deterministic
    apart = across(one, many)
    assert apart is not None and apart.token == 2 and "keep" in apart.variant
    assert across(one, check([A] * 4, 4)) is None and across(one, check([None] * 4, 4)) is None


@pytest.mark.parametrize(
    ("copies", "batch", "waves"),
    [(8, 1, [1] * 8), (8, 4, [4, 4]), (8, 3, [3, 3, 3]), (8, 16, [16])],
)
def test_copies_go_in_full_waves_of_the_batch(copies: int, batch: int, waves: list[int]) -> None:
    assert copies_per_wave(copies, batch) == waves


def test_overall_line_says_where_answers_were_identical_and_where_not() -> None:
    same, differ = check([A] * 8, 1), check([A] * 4 + [A.replace("one", "a")] * 4, 4)
    line = overall([("batch 1", same), ("batch 4", differ)])
    assert line == (
        "determinism (8 copies each): identical at batch 1; "
        "2 distinct at batch 4 (first difference at token 9)"
    )
    assert overall([]) is None


@pytest.mark.parametrize(
    ("kind", "argv", "environ", "on"),
    [
        ("vllm", ["vllm", "serve", "m"], {"VLLM_BATCH_INVARIANT": "1"}, True),
        ("vllm", ["vllm", "serve", "m"], {"VLLM_BATCH_INVARIANT": "0"}, False),
        ("vllm", ["env", "VLLM_BATCH_INVARIANT=1", "vllm", "serve"], {}, True),
        ("vllm", ["vllm", "serve", "m"], {}, False),
        ("vllm", None, None, None),
        (
            "sglang",
            ["python", "-m", "sglang.launch_server", "--enable-deterministic-inference"],
            None,
            True,
        ),
        ("sglang", ["python", "-m", "sglang.launch_server"], None, False),
        ("sglang", None, {"X": "1"}, None),
    ],
)
def test_engine_switch_is_named_and_read_from_argv_and_environment(
    kind: str, argv: list[str] | None, environ: dict[str, str] | None, on: bool | None
) -> None:
    switch = engine_switch(kind, argv, environ)
    assert switch is not None and switch.on is on
    assert switch.switch in switch.advice()
    assert engine_switch("llamacpp", ["llama-server"], {}) is None


def test_mock_diverges_from_token_t_only_above_n_in_flight() -> None:
    prompt = "用一句话说明什么是定长数组。"
    full = text.natural_text("explain arrays", 0)
    for in_flight in (3, 4, 5):
        variant = text.diverge(full, "explain arrays", in_flight, 5, seed=0)
        assert first_difference(full, variant) == 5
        assert variant == text.diverge(full, "explain arrays", in_flight, 5, seed=0)  # seeded
    assert text.diverge(full, "x", 3, 5, 0) != text.diverge(full, "x", 3, 5, 1)  # per seed
    zh = text.natural_text(prompt, 0)
    assert first_difference(zh, text.diverge(zh, prompt, 3, 7, 0)) == 7
    with pytest.raises(ValueError, match="diverge_at_token"):
        MockSettings(diverge_at_token=5)
    with pytest.raises(ValueError, match="diverge_at_token"):
        MockSettings(nondeterministic_above=2, diverge_at_token=0)


DETERMINISM = "[determinism]\ncopies = 8\n"


def test_ladder_reports_one_answer_at_batch_1_2_and_several_at_4_through_the_real_mock(
    cli, isolated: Path
) -> None:
    with start_mock_process(
        "--ttft", "0.002", "--per-token", "0.0005", "--nondeterministic-above", "2",
        "--diverge-at-token", "5",
    ) as mock:  # fmt: skip
        write_config(isolated / "calibrate.toml", mock.base_url, FAST)
        assert cli("single").code == 0
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2, 4]\n" + DETERMINISM)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err  # informative: differing answers fail nothing
    detail = {t["batch_size"]: t for t in result.json["tiers_detail"]}
    assert [detail[b]["distinct_completions"] for b in (1, 2)] == [1, 1]
    assert detail[4]["distinct_completions"] > 1 and detail[4]["first_diff_token"] == 5
    assert detail[1]["first_diff_token"] is None and detail[4]["determinism_copies"] == 8
    assert "batch 4: " in result.err and "first difference at token 5" in result.err
    assert "identical at batch 1, batch 2" in result.err
    assert result.json["determinism"]["deterministic"] is False
    run = run_dir(isolated, result.json["run_id"])
    assert json.loads((run / "determinism.json").read_text("utf-8")) == result.json["determinism"]
    with (run / "tiers.csv").open(encoding="utf-8") as f:
        rows = {int(r["batch_size"]): r for r in csv.DictReader(f)}
    assert float(rows[2]["distinct_completions"]) == 1 and float(rows[4]["first_diff_token"]) == 5
    assert (
        jsonl(run / "tiers.jsonl")[2]["distinct_completions"] == detail[4]["distinct_completions"]
    )
    records = jsonl(run / "records.jsonl")
    copies = [r for r in records if r.get("determinism")]
    assert len(copies) == 3 * 8 and all(r["canary"] for r in copies)
    # the copies count in no measured figure: each tier's items are its rounds' waves alone
    assert [detail[b]["items"] for b in (1, 2, 4)] == [2, 4, 8]
    report = cli("report", str(run), "--html")
    assert report.code == 0, report.err
    page = (run / "report.html").read_text("utf-8")
    section = page[page.index('<section id="determinism">') :]
    section = section[: section.index("</section>")]
    assert "first differing token" in section and "<td>5</td>" in section
    common, variant = detail[4]["first_diff_common"], detail[4]["first_diff_variant"]
    assert html.escape(common) in section and html.escape(variant) in section


def test_copies_off_by_default_send_nothing_more(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, nondeterministic_above=2) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, FAST)
        assert cli("single").code == 0
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 4]\n")
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    assert "distinct_completions" not in result.json["tiers_detail"][0]
    assert "determinism" not in result.json and "determinism (" not in result.err


@pytest.mark.parametrize("copies", ["4", "-1", "2000"])
def test_too_few_copies_is_a_config_error(cli, isolated: Path, copies: str) -> None:
    write_config(
        isolated / "calibrate.toml", "http://127.0.0.1:9/v1", f"[determinism]\ncopies = {copies}\n"
    )
    result = cli("ladder")
    assert result.code == 2 and "[determinism] copies" in result.err


def test_sweep_reports_copies_per_level_after_its_window(cli, isolated: Path) -> None:
    sweep = FAST + "[sweep]\nconcurrency = [1, 2, 4]\nlevel_s = 0.1\nrepeats = 1\n" + DETERMINISM
    with start_mock_process(
        "--ttft", "0.002", "--per-token", "0.0005", "--nondeterministic-above", "2",
        "--diverge-at-token", "3",
    ) as mock:  # fmt: skip
        open_gate(isolated, mock.base_url, sweep, stage="ladder")
        result = cli("sweep", "--json", "--beyond-ladder")
    assert result.code == 0, result.err
    levels = {lv["concurrency"]: lv for lv in result.json["levels_detail"]}
    assert [levels[c]["distinct_completions"] for c in (1, 2)] == [1, 1]
    assert levels[4]["distinct_completions"] > 1 and levels[4]["first_diff_token"] == 3
    assert "concurrency 4: " in result.err and "first difference at token 3" in result.err
    run = run_dir(isolated, result.json["run_id"])
    with (run / "tiers.csv").open(encoding="utf-8") as f:
        rows = {int(r["concurrency"]): r for r in csv.DictReader(f)}
    assert float(rows[4]["first_diff_token"]) == 3
    copies = [r for r in jsonl(run / "records.jsonl") if r.get("determinism")]
    assert len(copies) == 3 * 8 and all(r["round"] is None for r in copies)


def test_single_determinism_n_one_by_one_and_at_once(cli, isolated: Path) -> None:
    with start_mock_process(
        "--ttft", "0.002", "--per-token", "0.0005", "--nondeterministic-above", "2",
        "--diverge-at-token", "4",
    ) as mock:  # fmt: skip
        write_config(isolated / "calibrate.toml", mock.base_url)
        plain = cli("single", "--determinism", "8", "--json")
        strict = cli("single", "--determinism", "8", "--require-match")
        calm = cli("single", "--determinism", "2", "--require-match")  # 2 in flight: alike
    assert plain.code == 0, plain.err  # informative without --require-match
    found = plain.json["determinism"]
    assert found["one_by_one"]["distinct_completions"] == 1
    assert found["at_once"]["distinct_completions"] > 1
    assert found["at_once"]["first_diff_token"] == 4 and found["deterministic"] is False
    assert "one after another: 8 of 8 copies identical" in plain.err
    assert "8 at once: " in plain.err and "first difference at token 4" in plain.err
    assert strict.code == 1 and "--require-match: the copies' answers differ" in strict.err
    assert calm.code == 0, calm.err
    assert "2 at once: 2 of 2 copies identical" in calm.err
    ledger = jsonl(isolated / "runs/ledger.jsonl")
    assert [e["passed"] for e in ledger] == [True, False, True]


def test_single_copies_that_failed_never_pass_require_match(cli, isolated: Path) -> None:
    """Half the requests fail (seeded: the answer comes, its copies do not): "0 of 4 copies
    identical" read as deterministic and --require-match passed, exit 0."""
    with start_mock_process(
        "--ttft", "0.002", "--per-token", "0.0005", "--fail-rate", "0.5", "--seed", "3"
    ) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        strict = cli("single", "--determinism", "4", "--require-match", "--json")
    assert strict.code == 1, strict.err
    assert strict.json["determinism"]["deterministic"] is None
    assert "unanswered — not established" in strict.err and "identical" not in strict.err
    assert "--require-match: copies went unanswered" in strict.err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--determinism", "1"], "--determinism 1: must be 2–1024"),
        (["--determinism", "5000"], "--determinism 5000"),
        (["--require-match"], "give --determinism N"),
    ],
)
def test_single_determinism_mistakes_are_exit_2(
    cli, isolated: Path, args: list[str], says: str
) -> None:
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    result = cli("single", *args)
    assert result.code == 2 and says in result.err


@pytest.mark.parametrize(
    ("server", "on"),
    [
        ('kind = "vllm"\ncommand = "env VLLM_BATCH_INVARIANT=1 vllm serve {model_path}"\n', True),
        ('kind = "vllm"\ncommand = "vllm serve {model_path}"\n', False),
        (
            'kind = "sglang"\ncommand = "python -m sglang.launch_server --enable-deterministic-inference"\n',
            True,
        ),
        ('kind = "sglang"\nmodel_path = "/m"\n', None),
    ],
)
def test_the_configured_engines_switch_is_read_when_no_server_is_managed(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, server: str, on: bool | None
) -> None:
    from calibrate import config
    from calibrate.stages.determinism import managed_switch

    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1", "[server]\n" + server)
    cfg = config.load(config.Overrides(config_path=str(isolated / "calibrate.toml")), {})
    switch = managed_switch(cfg)
    assert switch is not None and switch.on is on


def test_prompt_list_copies_go_in_one_request_of_b_prompts(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, FAST)
        assert cli("single").code == 0
        extra = FAST + 'mode = "prompt-list"\nbatch_sizes = [1, 4]\n' + DETERMINISM
        open_gate(isolated, mock.base_url, extra)
        result = cli("ladder", "--json")
    assert result.code == 0, result.err
    assert [t["distinct_completions"] for t in result.json["tiers_detail"]] == [1, 1]
    run = run_dir(isolated, result.json["run_id"])
    copies = [r for r in jsonl(run / "records.jsonl") if r.get("determinism")]
    assert len(copies) == 8 + 8 and {r["concurrency"] for r in copies} == {1}


def test_mock_refuses_diverge_without_nondeterministic_above(cli, isolated: Path) -> None:
    result = cli("mock", "--port", "0", "--diverge-at-token", "5")
    assert result.code == 2 and "diverge_at_token needs nondeterministic_above" in result.err


def test_single_require_match_failure_says_failed_in_json_too(cli, isolated: Path) -> None:
    """Copies that differ under --require-match: exit 1 and the ledger "passed": false, while
    --json said "passed": true — the answer's verdict, not the stage's."""
    with start_mock_process(
        "--ttft", "0.002", "--per-token", "0.0005", "--nondeterministic-above", "2",
        "--diverge-at-token", "4",
    ) as mock:  # fmt: skip
        write_config(isolated / "calibrate.toml", mock.base_url)
        strict = cli("single", "--determinism", "8", "--require-match", "--json")
    assert strict.code == 1, strict.err
    assert strict.json["passed"] is False
    assert jsonl(isolated / "runs/ledger.jsonl")[-1]["passed"] is False


def test_single_that_fails_require_match_writes_no_baseline(cli, isolated: Path) -> None:
    """single --determinism 8 --require-match failed (exit 1) and still wrote
    baselines/single.jsonl without a word, so repro's gate opened on a failed stage; the same
    with --save-baseline replaced a baseline."""
    with start_mock_process(
        "--ttft", "0.002", "--per-token", "0.0005", "--nondeterministic-above", "2",
        "--diverge-at-token", "4",
    ) as mock:  # fmt: skip
        write_config(isolated / "calibrate.toml", mock.base_url)
        strict = cli("single", "--determinism", "8", "--require-match", "--json")
        assert strict.code == 1, strict.err
        assert strict.json["baseline"] is None
        assert not (isolated / "baselines/single.jsonl").exists()
        assert cli("repro").code == 3  # the gate stays closed: no baseline
        assert cli("single").code == 0  # a passing single writes it
        kept = (isolated / "baselines/single.jsonl").read_text("utf-8")
        again = cli("single", "--save-baseline", "--determinism", "8", "--require-match")
    assert again.code == 1 and "baseline" not in again.err.split("--require-match")[-1]
    assert (isolated / "baselines/single.jsonl").read_text("utf-8") == kept
    assert not list((isolated / "baselines").glob("single.*.jsonl"))


def test_copies_at_once_against_a_server_of_fewer_slots_are_not_called_n_at_once(
    cli, isolated: Path
) -> None:
    """A mock of one slot that says so (llama.cpp's /props total_slots 1): before, single
    --determinism 8 said "8 at once: 8 of 8 copies identical" and --require-match passed,
    though the copies queued and never shared a batch. Now it says how many ran at once, and
    that N at once is not established; a ladder's line says it of each tier above the cap."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=1, expose_props=True) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2]\n" + DETERMINISM)
        plain = cli("single", "--determinism", "8", "--json")
        strict = cli("single", "--determinism", "8", "--require-match")
        ladder = cli("ladder", "--json")
    assert plain.code == 0, plain.err
    found = plain.json["determinism"]
    assert found["at_once"]["ran_at_once"] == 1 and found["at_once"]["in_flight"] == 8
    assert found["server_cap"] == {"slots": 1, "source": "llama.cpp /props total_slots"}
    assert found["deterministic"] is None and found["one_by_one"]["ran_at_once"] == 1
    said = " ".join(plain.err.split())
    assert "8 at once: 8 of 8 copies identical — but the server runs 1 at once" in said
    assert "the copies queued, at most 1 shared a batch, so this is not 8 at once" in said
    assert strict.code == 1
    assert "the server ran 1 at once, not 8" in " ".join(strict.err.split())
    line = " ".join(ladder.err.split())
    assert "identical at batch 1, batch 2 (the server ran 1 at once)" in line, ladder.err


def test_copies_whose_server_cap_is_unknown_say_so() -> None:
    unknown = check([A] * 8, 8)
    assert unknown.ran_at_once is None and not unknown.queued
    assert unknown.describe("8 at once").endswith("its cap could not be read)")
    room = check([A] * 8, 8, (16, "SGLang max_running_requests"))
    assert (
        room.ran_at_once == 8 and room.describe("8 at once") == "8 at once: 8 of 8 copies identical"
    )


@pytest.mark.parametrize("slots", [1, 4])
def test_a_server_that_publishes_no_cap_is_read_by_its_running_gauge_while_the_copies_run(
    cli, isolated: Path, slots: int
) -> None:
    """vLLM publishes no cap: a ladder's copies at batch 2 read "identical at batch 2" whether
    the server ran 2 at once or 1 (the other queued, sharing no batch). Its running gauge says
    which while the copies run: 1 running while the other waited — "the server ran 1 at once";
    2 running — they ran together. Where neither a cap nor the gauge can say, the line says that
    how many ran at once is not known."""
    with start_mock(ttft_s=0.2, per_token_s=0.0005, slots=slots) as mock:  # ~0.2 s an answer
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2]\n" + DETERMINISM)
        result = cli("ladder", "--json")
    assert_ladder_ran(result)  # a machine at load 15 starved the client: said, and the copies too
    line = " ".join(result.err.split())
    assert "not known" not in line, line  # the gauge said it, sampled every 50 ms
    if slots == 1:
        assert "identical at batch 1, batch 2 (the server ran 1 at once)" in line, line
    else:
        assert "identical at batch 1, batch 2" in line, line
        assert "the server ran" not in line, line  # 2 ran together: nothing to add
