"""`pin` for llama.cpp sizes -c (shared by its slots) for the job and says where it came from:
your -c in [server] args, else the batch input (--tasks), else a ladder that sent the job's
inputs; after a ladder of the fixed prompt alone, llama.cpp's default per slot stays."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.fakes import append_ledger
from tests.helpers import write_config

LADDER = "20261129T160000Z-ladder-abcdef"
TASKS = {"source": "tasks", "tasks": "job.jsonl", "tokens_per_char": 0.5}
FIXED = {"source": "fixed", "tokens_per_char": 1.4}


def _record(prompt_tokens: int, max_tokens: int, ok: bool = True) -> str:
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 7,
        "total_tokens": prompt_tokens + 7,
    }
    return json.dumps({"ok": ok, "usage": usage, "params": {"max_tokens": max_tokens}}) + "\n"


def _configure(cli, root: Path, args: str = "") -> str:
    server = f'[server]\nkind = "llamacpp"\nmodel_path = "/m/tiny.gguf"\nport = 8123\n{args}'
    write_config(root / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    return str(cli("status", "--json").json["target"])


def _ladder(root: Path, target: str, batch: int, workload: dict, records: str = "") -> None:
    run = root / "runs" / LADDER
    run.mkdir(parents=True)
    (run / "records.jsonl").write_text(records, "utf-8")
    summary = {"last_passing": {"batch_size": batch, "concurrency": 1}, "workload": workload}
    append_ledger(root, "ladder", target, summary, run_id=LADDER)


def _script(root: Path) -> str:
    return (root / "scripts/launch.sh").read_text("utf-8")


def test_pin_sizes_llamacpp_context_from_a_ladder_that_sent_the_jobs_inputs(
    cli, isolated: Path
) -> None:
    target = _configure(cli, isolated)
    # the failed request's longer prompt was not verified; the longest verified one is 40
    records = _record(13, 32) + _record(40, 32) + _record(900, 32, ok=False)
    _ladder(isolated, target, 4, TASKS, records)
    result = cli("pin", "--json")
    assert result.code == 0, result.err
    text = _script(isolated)
    assert "--parallel 4 -c 288 --metrics" in text, text
    context = (
        f"-c 288 = 4 slots x (longest input 40 + max_tokens 32 tokens) from ladder run {LADDER} "
        "(if llama.cpp splits it among its slots; with --kv-unified each may use all of it)"
    )
    assert f"# context: {context}" in text
    assert f"  context: {context}" in result.err.splitlines()  # said, not only written


def test_a_fixed_prompt_ladder_never_sizes_the_context_to_the_fixed_prompt(
    cli, isolated: Path
) -> None:
    """The reported case: a ladder of the fixed prompt (20 tokens, max_tokens 128) pinned
    -c 592 — 148 tokens a slot, too small for the first real document."""
    target = _configure(cli, isolated)
    _ladder(isolated, target, 4, FIXED, _record(20, 128) * 3)
    result = cli("pin")
    assert result.code == 0, result.err
    text = _script(isolated)
    assert "--parallel 4 -c 16384 --metrics" in text and "-c 592" not in text, text
    line = next(ln for ln in result.err.splitlines() if ln.startswith("  context: "))
    # calibrate's own default, and what a slot gets of it assumed, not read from the server
    assert line.startswith("  context: -c 16384 = 4 slots x calibrate's default of 4096 a slot (if")
    assert "llama.cpp's 4096" not in line and "with --kv-unified each may use all of it" in line
    assert "calibrate pin --tasks FILE" in line


def test_pin_tasks_sizes_the_context_from_the_longest_item_of_the_batch_input(
    cli, isolated: Path
) -> None:
    target = _configure(cli, isolated)
    _ladder(isolated, target, 2, FIXED)
    job = isolated / "job.jsonl"
    job.write_text(
        json.dumps({"id": 1, "text": "x" * 100}) + "\n" + json.dumps({"id": 2, "text": "y" * 1000})
    )
    result = cli("pin", "--tasks", str(job), "--prompt", "Summarise:", "--max-tokens", "200")
    assert result.code == 0, result.err
    # the longest message: "Summarise:\n" + 1000 characters = 1011, at the ladder's 1.4 tokens
    # a character, +10 % = 1557, + 200 = 1757 → 1792 a slot (whole 256-token blocks), 2 slots
    assert "--parallel 2 -c 3584 --metrics" in _script(isolated), _script(isolated)
    line = next(ln for ln in result.err.splitlines() if ln.startswith("  context: "))
    assert line.startswith("  context: -c 3584 = 2 slots x (longest input 1592 + max_tokens 200")
    assert line.endswith(
        "(if llama.cpp splits it among its slots; with --kv-unified each may use all of it)"
    )
    assert f"from {job} (its longest item, 1,011 characters at 1.4 tokens per character" in line


def test_a_context_you_set_in_server_args_is_used_and_said(cli, isolated: Path) -> None:
    """-c / --ctx-size in [server] args was refused; now it is the job's context, stated."""
    for stated in ('["-c", "8192"]', '["--ctx-size=8192"]'):
        for path in (isolated / "runs", isolated / "scripts"):
            shutil.rmtree(path, ignore_errors=True)
        target = _configure(cli, isolated, f"args = {stated}\n")
        _ladder(isolated, target, 4, TASKS, _record(40, 32))
        result = cli("pin")
        assert result.code == 0, result.err
        text = _script(isolated)
        command = next(ln for ln in text.splitlines() if ln.startswith("exec "))
        assert command.count("8192") == 1 and "-c 288" not in command, command
        assert "# context: -c 8192 from [server] args (2048 tokens a slot if llama.cpp" in text
        assert "(2048 tokens a slot)" not in text, "a slot's share is assumed, and said so"


def test_the_builder_writes_no_context_of_its_own_beside_yours_and_tune_replaces_yours() -> None:
    from calibrate.engines.base import LaunchSpec
    from calibrate.engines.builders import build

    yours = build(LaunchSpec("llamacpp", "/m", 9000, 4, 4, context_tokens=288, args=("-c", "8192")))
    assert yours.argv.count("-c") == 1 and yours.argv[-2:] == ("-c", "8192"), yours.argv
    tuned = (("ctx_size", "4096"),)
    spec = LaunchSpec("llamacpp", "/m", 9000, 4, 4, tuned=tuned, args=("--ctx-size=8192",))
    searched = build(spec)
    assert "--ctx-size=8192" not in searched.argv and searched.argv.count("-c") == 1
    assert "4096" in searched.argv and any("replaces" in note for note in searched.notes)
