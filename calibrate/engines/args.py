"""Which of a user's ``[server] args`` calibrate refuses, per engine kind: the flags each kind's
builder writes itself (the cap, the port, the model, the served name; llama.cpp's
--threads-http), by every spelling the engine takes (``Engine.own_flags``). llama.cpp's -c is
not one: a user's own is the job's context, and calibrate then sizes none. Both the config
check (``calibrate.config``) and the builders (``calibrate.engines.builders``) read it.
"""

from __future__ import annotations

from calibrate.engines import ENGINES, find
from calibrate.engines.base import ServerKind, flag_name

__all__ = ["MAX_ARGS", "OWN_FLAGS", "ServerKind", "args_problem", "flag_name"]

MAX_ARGS = 64  # entries in [server] args

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
