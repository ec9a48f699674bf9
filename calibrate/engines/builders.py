"""One entry for every engine kind: (model path, port, batch size, concurrency) → argv + env.

The same builder (``Engine.build``: ``base.command`` laid out by each kind's data, or the kind's
own ``launch``) feeds ``calibrate server start`` and the launch script ``pin`` writes, so the
pinned script starts exactly what calibrate would. Values go into argv elements, never through a shell: a model path with spaces, quotes or
``$(…)`` stays one literal argument.

A value of None means "not calibrated yet": the engine's own flag is left out (its default).
``LaunchSpec.tuned`` carries the engine flags ``calibrate tune`` chose, by the names of
``TUNE_FLAGS`` (or, for a custom command, as values of its ``{placeholders}``).

``[server] args`` (``LaunchSpec.args``) are the user's own engine flags (``--tensor-parallel-size
2``), appended verbatim and in order after the engine's own flags. A flag calibrate sets itself
(the cap, the port, the model, the served name; llama.cpp's -c and --threads-http) is refused
there (exit 2, ``args_problem``); a flag tune searches takes the tuned value instead of the one
in args (``EngineCommand.notes`` says so at the start).
"""

from __future__ import annotations

from calibrate.engines import ENGINES, KINDS, engine, find
from calibrate.engines.args import ServerKind, args_problem, env_problem
from calibrate.engines.base import EngineCommand, LaunchSpec, Tuned
from calibrate.engines.custom import BASE_PLACEHOLDERS
from calibrate.errors import ConfigError

__all__ = [
    "BASE_PLACEHOLDERS",
    "CAP_KEYS",
    "SERVER_KINDS",
    "TUNE_FLAGS",
    "EngineCommand",
    "LaunchSpec",
    "Tuned",
    "build",
    "health_path",
]

SERVER_KINDS: tuple[ServerKind, ...] = KINDS
#: the engine flags tune may set, by the name used in [tune] grid / --grid (one table per kind)
TUNE_FLAGS: dict[str, dict[str, str]] = {e.kind: dict(e.tune_flags) for e in ENGINES}
#: the flag that is the engine's cap B (SPEC §5.0), per kind
CAP_KEYS: dict[str, str] = {e.kind: e.cap_key for e in ENGINES}


def build(spec: LaunchSpec) -> EngineCommand:
    """The engine command for ``spec``; a missing model path or command is a config error."""
    kind = engine(spec.kind)  # an unknown kind: a config error naming the known ones
    problem = args_problem(spec.kind, spec.args)
    if problem:
        raise ConfigError(f"[server] {problem}", "Fix [server] args in calibrate.toml.")
    problem = env_problem(spec.kind, spec.env)
    if problem:
        raise ConfigError(f"[server] {problem}", "Fix [server] env in calibrate.toml.")
    return kind.build(spec)


def health_path(kind: str | None) -> str | None:
    """Where readiness is polled for ``kind`` (None: GET /v1/models)."""
    found = find(kind)
    return found.health_path if found is not None else None
