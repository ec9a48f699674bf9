"""`pin` for llama.cpp sizes -c from the verified workload and says so in the script's header."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes import append_ledger
from tests.helpers import write_config

LADDER = "20261129T160000Z-ladder-abcdef"


def _record(prompt_tokens: int, max_tokens: int, ok: bool = True) -> str:
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 7,
        "total_tokens": prompt_tokens + 7,
    }
    return json.dumps({"ok": ok, "usage": usage, "params": {"max_tokens": max_tokens}}) + "\n"


def _configure(cli, root: Path) -> str:
    server = '[server]\nkind = "llamacpp"\nmodel_path = "/m/tiny.gguf"\nport = 8123\n'
    write_config(root / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    return str(cli("status", "--json").json["target"])


def test_pin_sizes_llamacpp_context_from_the_ladder_records(cli, isolated: Path) -> None:
    target = _configure(cli, isolated)
    run = isolated / "runs" / LADDER
    run.mkdir(parents=True)
    # the failed request's longer prompt was not verified; the longest verified one is 40
    (run / "records.jsonl").write_text(
        _record(13, 32) + _record(40, 32) + _record(900, 32, ok=False), "utf-8"
    )
    append_ledger(
        isolated,
        "ladder",
        target,
        {"last_passing": {"batch_size": 4, "concurrency": 1}},
        run_id=LADDER,
    )
    result = cli("pin", "--json")
    assert result.code == 0, result.err
    text = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "--parallel 4 -c 288 --metrics" in text, text
    assert (
        f"# context: -c 288 = 4 slots x (longest verified prompt 40 + max_tokens 32 tokens) from ladder run {LADDER}"
        in text
    )


def test_pin_without_ladder_records_keeps_the_default_per_slot(cli, isolated: Path) -> None:
    target = _configure(cli, isolated)
    append_ledger(
        isolated,
        "ladder",
        target,
        {"last_passing": {"batch_size": 2, "concurrency": 1}},
        run_id=LADDER,
    )
    assert cli("pin").code == 0
    text = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "--parallel 2 -c 8192" in text and "# context:" not in text
