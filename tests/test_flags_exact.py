"""A flag is taken only as it is spelled: ``ladder --mode prompt-list`` is no ``--model``.

argparse's default completes an unambiguous prefix of a long flag, so ``--mode prompt-list``
(a flag ladder does not have) was read as ``--model prompt-list``: the target changed and the
gate said "model name (tiny → prompt-list) changed". Every parser refuses abbreviations.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from calibrate.cli import COMMAND_MODULES, build_parser
from tests.helpers import REPO, write_config


def _parsers(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_command_and_sub_command_refuses_abbreviated_flags() -> None:
    found = dict(_parsers(build_parser(), "calibrate"))
    assert {f"calibrate {c}" for c in COMMAND_MODULES} <= set(found)
    assert "calibrate server start" in found  # the nested ones are walked too
    taking = [name for name, parser in found.items() if parser.allow_abbrev]
    assert not taking, f"these parsers complete abbreviated flags: {taking}"


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("ladder", ["--mode", "prompt-list"]),  # was --model prompt-list
        ("single", ["--mod", "other"]),
        ("sweep", ["--base", "http://127.0.0.1:1/v1"]),
        ("batch", ["--input", "t.jsonl", "--conc", "4"]),  # was --concurrency 4
    ],
)
def test_an_abbreviation_is_a_usage_error_and_nothing_is_written(
    cli, tmp_path: Path, command: str, words: list[str]
) -> None:
    write_config(tmp_path / "calibrate.toml", "http://127.0.0.1:9/v1")
    result = cli(command, *words)
    assert result.code == 2, result.err
    short = words[-2]
    assert f"unrecognized arguments: {short}" in result.err
    assert not (tmp_path / "runs").exists()


def test_every_argument_parser_in_the_repository_refuses_abbreviations() -> None:
    """Scripts, benches and test fakes too: each ``ArgumentParser(`` says allow_abbrev=False
    (the command line's own parser class, ``StrictParser``, sets it for every sub-command)."""
    offenders = []
    for folder in ("calibrate", "scripts", "bench", "tests"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for match in re.finditer(r"\bArgumentParser\(", text):
                line_start = text.rfind("\n", 0, match.start()) + 1
                if text[line_start:].lstrip().startswith("class "):
                    continue  # a subclass (StrictParser) sets it in its __init__
                call = text[match.end() : match.end() + 400].split("\n)", 1)[0]
                if "allow_abbrev=False" not in call and path.name != "test_flags_exact.py":
                    line = text[: match.start()].count("\n") + 1
                    offenders.append(f"{path.relative_to(REPO)}:{line}")
    assert not offenders, f"parsers that complete abbreviated flags: {offenders}"
