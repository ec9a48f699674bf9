"""The launch script ``pin`` writes: the verified setting as exported variables, then ``exec``.

Every value is passed through ``shlex.quote``; comments carry only run ids and timestamps (and
lose any line break), so nothing read from the config can end up executed. The exec line holds
the literal values, not ``$VARS``: a ``PORT`` left in the caller's environment cannot change it.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

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
    """Parse the ``# kind:`` header and the ``export NAME=value`` lines (without running it)."""
    try:
        text = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"cannot read the launch script {path}: {exc}", "Write one with: calibrate pin"
        ) from exc
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
