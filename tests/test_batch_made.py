"""A journal knows what produced each result (io/journal/made.py): a resume whose settings differ
— --prompt, --model, --max-tokens, --temperature, the server — is refused, saying what changed
(exit 2, nothing sent), unless --allow-mixed keeps the mix; an item whose text changed runs
again; export never passes an edited item's old result off as its result, and says when the
journals it merges mix settings. Journals written before this are resumed as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.io.journal.made import Settings
from tests.batch_helpers import results, write_tasks
from tests.helpers import write_config
from tests.mockserver import start_mock

FIRST = ["--prompt", "A:", "--max-tokens", "64", "--temperature", "0"]
CHANGES = {
    "--prompt": (["--prompt", "Summarize in English:"], "--prompt 'A:' (now 'Summarize in"),
    "--max-tokens": (["--max-tokens", "256"], "--max-tokens 64 (now 256)"),
    "--temperature": (["--temperature", "0.7"], "--temperature 0.0 (now 0.7)"),
    "--model": (["--model", "other-model"], "--model 'internlm-s2' (now 'other-model')"),
    "the server": ([], "the server gpu-box-a (now 127.0.0.1)"),
}


@pytest.fixture
def any_model() -> object:
    with start_mock(ttft_s=0.001, per_token_s=0.0002, any_model=True) as server:
        yield server


def _made_on(journal: Path, host: str) -> None:
    """Rewrite ``journal`` as if its results had been made against ``host``: its settings and
    every line's stamp of them."""
    lines = [json.loads(line) for line in journal.read_text("utf-8").splitlines()]
    whole = next(line["settings"] for line in lines if "settings" in line)
    moved = Settings.of(whole["model"], whole["prompt"], whole["params"], (host,))
    for line in lines:
        line["made"] = moved.fp
        if "settings" in line:
            line["settings"] = moved.to_json()
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines), "utf-8")


def _batch(cli, *args: str):
    return cli("batch", "--input", "tasks.jsonl", "--out", "out.jsonl", *args)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_resume_with_other_settings_is_refused_saying_what_changed(
    cli, any_model, isolated: Path, change: str
) -> None:
    write_config(isolated / "calibrate.toml", any_model.base_url)
    write_tasks(isolated / "tasks.jsonl", 5)
    assert _batch(cli, *FIRST, "--limit", "3").code == 0
    if change == "the server":  # this machine by any name is one host: say it was another
        _made_on(isolated / "out.jsonl", "gpu-box-a")
    journal = (isolated / "out.jsonl").read_bytes()
    flags, said = CHANGES[change]
    rest = [*FIRST, *flags]
    sent = any_model.model.snapshot().requests_total
    refused = _batch(cli, *rest)
    assert refused.code == 2, refused.err
    assert "holds 3 result(s) made with other settings" in refused.err
    assert said in refused.err and "--allow-mixed" in refused.err
    assert any_model.model.snapshot().requests_total == sent  # nothing sent
    assert (isolated / "out.jsonl").read_bytes() == journal  # nothing written
    # accepted explicitly: the 3 kept, the other 2 run with the new settings, the mix said
    mixed = _batch(cli, *rest, "--allow-mixed", "--final", "final.jsonl")
    assert mixed.code == 0, mixed.err
    assert "3 result(s) in out.jsonl were made with other settings" in mixed.err
    assert "the final file mixes settings: 2 of 5 results were made with other" in mixed.err
    assert len(results(isolated / "final.jsonl")) == 5


def test_the_same_settings_resume_without_a_word(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 6)
    assert _batch(cli, *FIRST, "--limit", "2").code == 0
    again = _batch(cli, *FIRST, "--workers", "2")  # the processes stamp lines the same way
    assert again.code == 0, again.err
    assert "2 already done, 4 to run" in again.err and "settings" not in again.err
    lines = results(isolated / "out.jsonl")
    assert len({line["made"] for line in lines}) == 1
    assert [("settings" in line) for line in lines].count(True) == 2  # each run's first


def test_an_item_whose_text_changed_runs_again_and_export_never_passes_its_old_result(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = write_tasks(isolated / "tasks.jsonl", 5)
    assert _batch(cli, *FIRST).code == 0
    edited = tasks.read_text("utf-8").replace("第2段", "第二段 (edited)")
    tasks.write_text(edited, "utf-8")
    # before the rerun: export does not give t2 the result of its old text
    stale = cli(
        "export", "--input", "tasks.jsonl", "--out", "out.jsonl", "--to", "f.jsonl", "--json"
    )
    assert stale.code == 1 and stale.json["changed"] == 1 and stale.json["ok"] == 4
    final = {r["id"]: r for r in results(isolated / "f.jsonl")}
    assert final["t2"]["error"]["kind"] == "not_run"
    assert "earlier text of this item" in final["t2"]["error"]["message"]
    assert "1 id(s) changed in the input since their result" in stale.err
    rerun = _batch(cli, *FIRST, "--final", "final.jsonl", "--json")
    assert rerun.code == 0, rerun.err
    assert "1 item(s) changed in tasks.jsonl since their result (e.g. id 't2')" in rerun.err
    assert rerun.json["skipped"] == 4 and rerun.json["done"] == 1
    after = {r["id"]: r for r in results(isolated / "final.jsonl")}
    assert all(r["ok"] for r in after.values()) and len(after) == 5
    assert after["t2"]["input_fp"] != final["t1"].get("input_fp")


def test_a_journal_written_before_settings_were_recorded_resumes_with_a_note(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 4)
    old = [{"id": f"t{i}", "ok": True, "output": "x", "attempts": 1} for i in range(2)]
    (isolated / "out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old), "utf-8")
    result = _batch(cli, *FIRST, "--json")
    assert result.code == 0, result.err
    assert result.json["skipped"] == 2 and result.json["done"] == 2
    assert "2 result(s) in out.jsonl were written by an older calibrate" in result.err


def test_export_says_when_shards_were_run_with_different_settings(
    cli, mock, isolated: Path
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 12)
    for index, prompt in enumerate(["A:", "A:", "B:"]):
        shard = ["--shard", f"{index}/3", "--out", f"out-{index}.jsonl"]
        args = ["batch", "--input", "tasks.jsonl", *shard, "--prompt", prompt]
        assert cli(*args).code == 0
    merged = cli(
        "export",
        "--input",
        "tasks.jsonl",
        "--out",
        "out-0.jsonl,out-1.jsonl,out-2.jsonl",
        "--to",
        "final.jsonl",
        "--json",
    )
    assert merged.code == 0, merged.err
    assert "the final file mixes settings" in merged.err
    said = ("--prompt 'A:' (the rest 'B:')", "--prompt 'B:' (the rest 'A:')")
    assert any(text in merged.err for text in said), merged.err
    assert merged.json["mixed_settings"]


def test_results_never_checked_as_json_are_not_passed_off_as_checked(
    cli, mock, isolated: Path
) -> None:
    """A batch run as text, resumed with --expect json: the ok lines it kept were never parsed,
    and the resume said "all 5 items ok" over prose (exit 0). The check is a setting of the
    results now: refused as any other (exit 2, nothing sent), and the text run's settings keep
    the fingerprint they had (journals written before resume as they are)."""
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 5)
    assert _batch(cli, "--limit", "3").code == 0
    first = results(isolated / "out.jsonl")[0]
    assert "expect" not in first["settings"]  # a text run's settings: as before
    sent = mock.model.snapshot().requests_total
    refused = _batch(cli, "--expect", "json")
    assert refused.code == 2, refused.err
    assert "holds 3 result(s) made with other settings: --expect text (now json)" in refused.err
    assert mock.model.snapshot().requests_total == sent
