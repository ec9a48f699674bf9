"""JSON nested too deeply to parse, wherever calibrate reads JSON it did not write this run.

``json.loads("[" * 100_000)`` raises RecursionError, not ValueError, so every ``except
ValueError`` that guards a server's answer, a tasks file or the ledger let it through as a
traceback: a 500 whose body is ``[[[[…`` in ``single``, ``/props`` of that shape in the ladder, one
such line in ``--tasks`` or in ``runs/ledger.jsonl``. calibrate has one parse of outside JSON
(``calibrate.json_text``); the first test keeps every other module on it, the rest drive the
real commands into each door.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from calibrate.stages.prepare.server_cap import read_server_cap
from tests.canned_server import CannedServer
from tests.helpers import CHAT_REPLY, REPO, write_config
from tests.tier_helpers import FAST, open_gate

DEEP = ("[" * 100_000).encode()
MODELS = (200, {}, b'{"data": [{"id": "internlm-s2"}]}')
CHAT = (200, {}, json.dumps(CHAT_REPLY).encode())


def _json_parses(path: Path) -> list[int]:
    """Lines of ``path`` calling ``json.loads`` or ``json.load``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (
                isinstance(owner, ast.Name)
                and owner.id == "json"
                and node.func.attr
                in (
                    "loads",
                    "load",
                )
            ):
                found.append(node.lineno)
    return found


def test_outside_json_is_parsed_in_one_place() -> None:
    package = REPO / "calibrate"
    calls = {
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "json_text.py"
        for line in _json_parses(path)
    }
    assert not calls, f"parse outside JSON with calibrate.json_text.loads: {sorted(calls)}"


@pytest.mark.parametrize(
    ("path", "key", "source"),
    [
        ("/props", "total_slots", "llama.cpp /props total_slots"),
        ("/get_server_info", "max_running_requests", "SGLang max_running_requests"),
    ],
)
def test_every_engines_cap_report_is_read_range_checked_and_deep_json_is_no_cap(
    path: str, key: str, source: str
) -> None:
    """One reader for the ladder, the sweep and tune: each engine's own report, a count out of
    range or nesting too deep is no cap (the ladder's reader once took 10**330 as a cap)."""

    def answering(value: object) -> object:
        text = value if isinstance(value, str) else json.dumps({key: value})
        return lambda asked: text if asked == path else "{}"

    cap = read_server_cap(answering(6))  # type: ignore[arg-type]
    assert cap is not None and (cap.slots, cap.source) == (6, source)
    for bad in (10**330, -4, 0, True, "[" * 100_000):
        assert read_server_cap(answering(bad)) is None, bad  # type: ignore[arg-type]


def test_a_500_nested_too_deeply_is_a_failed_call_not_a_traceback(cli, isolated: Path) -> None:
    replies = {"/v1/models": MODELS, "/v1/chat/completions": (500, {}, DEEP)}
    with CannedServer(replies) as server:  # type: ignore[arg-type]
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("single")
    assert result.code == 1, result.err
    assert "http_5xx" in result.err or "HTTP 500" in result.err, result.err
    assert "Traceback" not in result.err


def test_a_ladder_against_props_nested_too_deeply_has_no_cap(cli, isolated: Path) -> None:
    replies = {
        "/v1/models": MODELS,
        "/v1/chat/completions": CHAT,
        "/props": (200, {}, DEEP),
        "/get_server_info": (200, {}, DEEP),
    }
    with CannedServer(replies) as server:  # type: ignore[arg-type]
        open_gate(isolated, server.base_url, FAST + "batch_sizes = [1, 2]\n")
        result = cli("ladder", "--no-stream", "--json")
        asked = set(server.hits)
    assert result.code == 0, result.err
    assert {"/props", "/get_server_info"} <= asked  # the doors were knocked on
    assert "server's own cap" not in result.err
    assert [t["verdict"] for t in result.json["tiers"]] == ["pass", "pass"]


def test_a_task_nested_too_deeply_is_exit_2_naming_the_line(cli, isolated: Path) -> None:
    tasks = isolated / "tasks.jsonl"
    tasks.write_bytes(b'{"id": "a", "text": "fine"}\n{"id": "b", "text": ' + DEEP + b"}\n")
    with CannedServer({"/v1/models": MODELS, "/v1/chat/completions": CHAT}) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli("batch", "--input", str(tasks), "--out", str(isolated / "out.jsonl"))
        sent = server.hits.count("/v1/chat/completions")
    assert result.code == 2, result.err
    assert "tasks.jsonl line 2: not JSON" in result.err, result.err
    assert sent == 0 and not (isolated / "out.jsonl").exists()


def test_a_ledger_line_nested_too_deeply_is_skipped_with_a_warning(cli, isolated: Path) -> None:
    with CannedServer({"/v1/models": MODELS}) as server:
        open_gate(isolated, server.base_url)
        with (isolated / "runs/ledger.jsonl").open("ab") as ledger:
            ledger.write(DEEP + b"\n")
        result = cli("status")
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    assert "ledger" in result.err and "line 2" in result.err, result.err
