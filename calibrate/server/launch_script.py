"""The launch script ``pin`` writes: the verified setting as exported variables, then ``exec``.

Every value is passed through ``shlex.quote``; comments carry only run ids and timestamps (and
lose any line break), so nothing read from the config can end up executed. The exec line holds
the literal values, not ``$VARS``: a ``PORT`` left in the caller's environment cannot change it.

``server start --script`` accepts a bash script that starts a server: the one ``pin`` wrote, or a
user's own. Plainly not one — a directory, an empty or binary file, a TOML or JSON file (a config
given by mistake), another language's script — is refused before anything starts: bash would run
it line by line and only the server's exit would say so.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from calibrate import json_text
from calibrate.engines import engine, redaction
from calibrate.engines.builders import SERVER_KINDS, EngineCommand
from calibrate.errors import InputError
from calibrate.io.atomic import write_atomic
from calibrate.io.bounded import read_text

SCRIPT_MODE = 0o755


@dataclass(frozen=True)
class PinnedValues:
    kind: str
    model_path: str
    port: int
    batch_size: int
    concurrency: int
    verified_by: str  # "ladder run <id>" that verified the batch size (after a rollback:
    # "ladder run <id> (returned to by rollback run <id>)")
    verified_at: str
    concurrency_from: str  # the sweep run that recommended it, or "default (no sweep passed)"
    pinned_by: str
    pinned_at: str
    workload: str = "the fixed prompt"
    context: str = ""  # how the engine's context was sized (llama.cpp -c), when it was
    tuned: str = ""  # "tune run <id>: parallel=4, ctx_size=2048" — every flag the winner ran with
    cost: str = ""  # "0.41 J/output token (312 W), $1.23 per 1M output tokens" (SPEC §13)
    how_sure: tuple[
        str, ...
    ] = ()  # "sweep: knee at 2 (+78 % over 1) — not sure", taken under noise


def _comment(text: str) -> str:
    return " ".join(str(text).split())


def _plain(text: str) -> str:
    """Only characters that mean nothing to a shell, even inside "${VAR:?…}"."""
    return re.sub(r"[^\w .-]", "", text)


def render(values: PinnedValues, command: EngineCommand) -> str:
    """The script text; ``bash -n`` accepts it for every engine kind.

    A secret in the command (``--api-key X``, ``HF_TOKEN=…``) is never written: the script
    reads it from an environment variable its header names, and stops if that is unset.
    """
    q = shlex.quote
    prefix = "SERVER" if engine(values.kind).templated else values.kind.upper()
    script = redaction.script_command(command.argv, command.env, prefix)
    needs = [
        f"# set {var} before running it: it carries {_comment(what)} (secrets are not written here)"
        for var, what in script.needs
    ]
    lines = [
        "#!/usr/bin/env bash",
        "# Written by `calibrate pin`: the setting verified on this machine. Regenerate, do not edit.",
        f"# kind: {_comment(values.kind)}",
        f"# batch size verified by {_comment(values.verified_by)} at {_comment(values.verified_at)}",
        f"# concurrency from {_comment(values.concurrency_from)}",
        *(f"# how sure: {_comment(line)}" for line in values.how_sure),
        f"# workload: {_comment(values.workload)}",
        f"# pinned by run {_comment(values.pinned_by)} at {_comment(values.pinned_at)}",
        *([f"# context: {_comment(values.context)}"] if values.context else []),
        *([f"# engine flags tuned by {_comment(values.tuned)}"] if values.tuned else []),
        *([f"# at this setting: {_comment(values.cost)}"] if values.cost else []),
        "# start it: calibrate server start --script <this file>; then check it: calibrate verify",
        *needs,
        "set -euo pipefail",
        *(f': "${{{var}:?set {var}: it carries {_plain(what)}}}"' for var, what in script.needs),
        *(f"export {var}" for var, _ in script.needs),
        "",
        f"export MODEL_PATH={q(values.model_path)}",
        f"export PORT={q(str(values.port))}",
        f"export BATCH_SIZE={q(str(values.batch_size))}",
        f"export MAX_CONCURRENCY={q(str(values.concurrency))}",
    ]
    lines += list(script.env_lines)
    lines += ["", f"exec {script.line}", ""]
    return "\n".join(lines)


def write(path: Path, text: str) -> Path:
    """Write atomically and make it executable (0755)."""
    write_atomic(path, text)
    os.chmod(path, SCRIPT_MODE)
    return path


@dataclass(frozen=True)
class ScriptSettings:
    """What a pinned script says about itself (for ``server start --script``)."""

    kind: str | None
    port: int | None
    batch_size: int | None
    concurrency: int | None


def read_settings(path: Path) -> ScriptSettings:
    """Parse the ``# kind:`` header and the ``export NAME=value`` lines (without running it);
    a file that is plainly no launch script (a config, a binary, empty) is an InputError."""
    text = launch_script_text(path)  # plainly no launch script: exit 2 before anything runs
    kind: str | None = None
    exported: dict[str, str] = {}
    for line in text.split("\n"):  # a value may hold U+2028: only "\n" ends a line
        if line.startswith("# kind:"):
            found = line.removeprefix("# kind:").strip()
            kind = found if found in SERVER_KINDS else None
        elif line.startswith("export "):
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            if len(words) == 2 and "=" in words[1]:
                name, value = words[1].split("=", 1)
                exported[name] = value

    def number(name: str) -> int | None:
        value = exported.get(name, "")
        return int(value) if value.isdigit() else None

    return ScriptSettings(kind, number("PORT"), number("BATCH_SIZE"), number("MAX_CONCURRENCY"))


GIVE = "give the script calibrate pin wrote (scripts/launch.sh) or a bash script that starts it"
HINT = "Write one with: calibrate pin   (or start from [server]: calibrate server start)"
SHELLS = ("bash", "sh")  # calibrate runs the script with bash; a sh script runs under it too
DATA_SUFFIXES = (".toml", ".json", ".jsonl", ".yaml", ".yml", ".csv", ".ini", ".cfg")
SYNTAX_CHECK_S = 10.0


def launch_script_text(path: Path) -> str:
    """The text of ``path`` when it can be a launch script; an InputError (exit 2) saying what
    it is instead and what to give, before anything runs."""
    if not path.exists():
        _refuse(path, "no such file")
    if path.is_dir():
        _refuse(path, "a directory")
    if not path.is_file():
        _refuse(path, "not a regular file (bash and calibrate would each read a pipe once)")
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        _refuse(path, f"not a text file ({getattr(exc, 'strerror', None) or 'not UTF-8'})")
    if "\0" in text:
        _refuse(path, "not a text file (it holds NUL bytes: a binary?)")
    if not _commands(text):
        _refuse(path, "empty (no command in it)")
    _refuse_data(path, text)
    _refuse_interpreter(path, text)
    _refuse_syntax(path)
    return text


def _refuse(path: Path, what: str) -> NoReturn:
    raise InputError(f"--script {path}: {what}; {GIVE}", HINT)


def _commands(text: str) -> list[str]:
    lines = (line.strip() for line in text.split("\n"))
    return [line for line in lines if line and not line.startswith("#")]


def _refuse_data(path: Path, text: str) -> None:
    """A TOML, JSON or other data file: by its name, or by text that parses as one."""
    if path.suffix.lower() in DATA_SUFFIXES:
        _refuse(path, f"a {path.suffix.lower().lstrip('.').upper()} file, not a launch script")
    if text.startswith("#!"):
        return
    try:
        json_text.loads(text)
    except ValueError:
        pass
    else:
        _refuse(path, "a JSON file, not a launch script")
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return
    if any(isinstance(value, dict) for value in parsed.values()):  # [section]: a config
        _refuse(path, "a TOML file (a config?), not a launch script")


def _refuse_interpreter(path: Path, text: str) -> None:
    """A ``#!`` line naming another interpreter: bash would read that language as bash."""
    first = text.split("\n", 1)[0]
    if not first.startswith("#!"):
        return
    words = first[2:].split()
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    program = Path(words[0]).name if words else ""
    if program and program not in SHELLS:
        _refuse(
            path, f"a {program} script (#!{first[2:].strip()}), and calibrate runs it with bash"
        )


def _refuse_syntax(path: Path) -> None:
    """``bash -n``: read, nothing run; a script bash cannot parse never starts."""
    bash = shutil.which("bash")
    if bash is None:
        return  # the start says bash is missing
    try:
        checked = subprocess.run(
            [bash, "-n", str(path)],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=SYNTAX_CHECK_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return
    if checked.returncode != 0:
        said = (checked.stderr.strip().splitlines() or ["a syntax error"])[0]
        _refuse(path, f"not a script bash can read ({said})")
