"""Which of a user's ``[server] args`` calibrate refuses, per engine kind: the flags each kind's
builder writes itself (the cap, the port, the model, the served name; llama.cpp's -c and
--threads-http), by every spelling the engine takes (``Engine.own_flags``). Both the config
check (``calibrate.config``) and the builders (``calibrate.engines.builders``) read it.
"""

from __future__ import annotations

import re

from calibrate.engines import ENGINES, find
from calibrate.engines.base import ServerKind, flag_name

__all__ = [
    "MAX_ARGS",
    "MAX_ENV",
    "OWN_FLAGS",
    "ServerKind",
    "args_problem",
    "env_problem",
    "flag_name",
]

MAX_ARGS = 64  # entries in [server] args
MAX_ENV = 64  # variables in [server] env
#: what a variable's name may be: a shell name, so the pinned script can export it
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: the pinned script's own variables (SPEC §5.8): [server] env may not shadow them
SCRIPT_VARIABLES = ("MODEL_PATH", "PORT", "BATCH_SIZE", "MAX_CONCURRENCY")

#: the flags each kind's builder writes itself, by every spelling the engine takes
OWN_FLAGS: dict[str, dict[str, str]] = {e.kind: dict(e.own_flags) for e in ENGINES if e.own_flags}


def args_problem(kind: str | None, args: tuple[str, ...]) -> str:
    """Why ``[server] args`` cannot be used with ``kind`` ("" when it can)."""
    bad = next((a for a in args if "\0" in a or "\n" in a or "\r" in a), None)
    if bad is not None:
        return f"args entry {bad!r} holds a NUL or a line break: give one argument per entry"
    if len(args) > MAX_ARGS:
        return f"args has {len(args)} entries; at most {MAX_ARGS} are allowed"
    if not args or kind is None:
        return ""
    found = find(kind)
    if found is not None and found.args_refused:
        return found.args_refused
    own = found.own_flags if found is not None else {}
    for word in args:
        name = flag_name(word)
        if name is not None and name in own:
            return f"args sets {name}, which {own[name]}"
    return ""


def env_problem(kind: str | None, env: tuple[tuple[str, str], ...]) -> str:
    """Why ``[server] env`` cannot be used with ``kind`` ("" when it can): a name that is not a
    shell variable's, a value with a NUL or a line break, one the engine's launch sets itself
    (Ollama's host and cap), or one of the pinned script's own variables."""
    if len(env) > MAX_ENV:
        return f"env has {len(env)} variables; at most {MAX_ENV} are allowed"
    found = find(kind)
    own = found.env_set if found is not None else ()
    for name, value in env:
        if not ENV_NAME.fullmatch(name):
            return (
                f"env name {name!r} is not a variable name (letters, digits and _, not "
                "starting with a digit)"
            )
        if any(c in value for c in "\0\n\r"):
            return f"env {name} holds a NUL or a line break: give it one line"
        if name in own:
            return (
                f"env sets {name}, which calibrate sets for {kind} from [server] and the batch size"
            )
        if name in SCRIPT_VARIABLES:
            return f"env sets {name}, a variable of the launch script pin writes: remove it"
    return ""
