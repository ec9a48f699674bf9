"""Bytes that are not UTF-8 on the command line (a GBK shell script on a UTF-8 system) are exit 2
naming the flag, before anything is sent — for every flag and positional of every command; a
file name keeps its bytes; under a locale that is not UTF-8 (``LC_ALL=C``) UTF-8 text is read as
UTF-8 and said so. Never a traceback, never items failed as ``internal``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.cli import build_parser
from calibrate.cli.argv_text import names_a_file
from tests.helpers import REPO, write_config

GBK = b"\xd2\xbb\xbe\xe4"  # "一句" in GBK: not UTF-8 from its third byte on
AS_PYTHON_GETS_IT = os.fsdecode(GBK)  # what a UTF-8 locale hands Python: 'һ\udcbe\udce4'


def _commands(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append(((*prefix, name), sub))
                found.extend(_commands(sub, (*prefix, name)))
    return found


def _value_flags() -> list[tuple[tuple[str, ...], argparse.Action, list[str]]]:
    """(command, action, the words its required flags need) for every action taking a value."""
    out = []
    for command, sub in _commands(build_parser()):
        needed: list[str] = []
        for action in sub._actions:
            if action.required and action.option_strings:
                needed += [action.option_strings[-1], "x.jsonl"]
            elif not action.option_strings and action.nargs is None:
                needed.append("x.jsonl")
        for action in sub._actions:
            takes_value = action.nargs != 0 and not isinstance(
                action, argparse._HelpAction | argparse._SubParsersAction
            )
            if takes_value:
                out.append((command, action, needed))
    return out


VALUE_FLAGS = _value_flags()  # once: it builds every command's parser (80 ms a collection)
TEXT_FLAGS = [
    pytest.param(c, a, n, id=" ".join(c) + " " + (a.option_strings or [a.dest])[-1])
    for c, a, n in VALUE_FLAGS
    if not names_a_file(a)
]
FILE_FLAGS = [(c, a) for c, a, _ in VALUE_FLAGS if names_a_file(a)]


@pytest.mark.parametrize(("command", "action", "needed"), TEXT_FLAGS)
def test_every_text_flag_refuses_bytes_that_are_not_utf8_before_anything_is_sent(
    cli, mock, isolated: Path, command: tuple[str, ...], action: argparse.Action, needed: list[str]
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    value = AS_PYTHON_GETS_IT
    if action.option_strings:
        words = [*command, *needed, action.option_strings[-1], value]
    else:  # a positional: in its own place (the only text positional would be the first)
        words = [*command, value, *needed[1:]]
    result = cli(*words)
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    named = (action.option_strings or [action.metavar or action.dest])[-1]
    assert str(named) in result.err, result.err
    assert mock.model.snapshot().requests_total == 0
    assert not (isolated / "runs").exists()


def test_every_flag_that_names_a_file_is_listed_as_one() -> None:
    """What keeps its bytes: the flags (and positionals) whose --help value reads PATH, FILE…"""
    named = sorted({(a.option_strings or [a.dest])[-1] for _, a in FILE_FLAGS})
    assert named == [
        "--compare",
        "--config",
        "--failed",
        "--final",
        "--html",
        "--input",
        "--junit",
        "--out",
        "--port-file",
        "--script",
        "--tasks",
        "--to",
        "files",
        "path",
        "run_b",
        "run_dir",
    ]


def test_a_file_name_that_is_not_utf8_opens_that_file(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    name = os.fsdecode(b"\xd6\xd0\xce\xc4.jsonl")  # "中文.jsonl" in GBK
    (isolated / name).write_text('{"id": 1, "text": "a"}\n', "utf-8")
    result = cli("batch", "--input", name, "--out", "out.jsonl")
    assert result.code == 0, result.err
    assert json.loads((isolated / "out.jsonl").read_text("utf-8"))["ok"] is True


def _calibrate(root: Path, args: list[bytes], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable.encode(), b"-m", b"calibrate", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        timeout=120,
    )


def test_a_gbk_prompt_from_a_shell_script_is_exit_2_naming_the_flag(mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n', "utf-8")
    words = [b"batch", b"--input", b"tasks.jsonl", b"--out", b"out.jsonl", b"--prompt", GBK]
    done = _calibrate(isolated, words, {"LC_ALL": "C.UTF-8"})
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, err
    assert "--prompt is not UTF-8 text" in err and "一句" in err and "Traceback" not in err
    assert not (isolated / "out.jsonl").exists()
    assert mock.model.snapshot().requests_total == 0
    bad_model = _calibrate(isolated, [b"status"], {"CALIBRATE_MODEL": os.fsdecode(b"m\xff")})
    assert bad_model.returncode == 2 and b"$CALIBRATE_MODEL is not UTF-8" in bad_model.stderr


def test_utf8_text_under_the_c_locale_is_read_as_utf8_and_said(mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n', "utf-8")
    outputs = []
    for name, env in (("utf8", {"LC_ALL": "C.UTF-8"}), ("c", {"LC_ALL": "C", "PYTHONUTF8": "0"})):
        words = [b"batch", b"--input", b"tasks.jsonl", b"--out", f"{name}.jsonl".encode()]
        done = _calibrate(isolated, [*words, b"--prompt", "总结：".encode()], env)
        err = done.stderr.decode("utf-8", "replace")
        assert done.returncode == 0, err
        assert ("read as UTF-8" in err) == (name == "c") and "Traceback" not in err
        outputs.append(json.loads((isolated / f"{name}.jsonl").read_text("utf-8"))["output"])
    assert outputs[0] == outputs[1], "the same prompt was sent (the mock's answer follows it)"
