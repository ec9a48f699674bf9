"""A user's own command (``kind = "custom"``): a template whose ``{placeholders}`` calibrate fills.

The template is split first, then each argument substituted: a value never re-splits. Where an
argument is itself a shell program (``bash -c '…'``), values are shell-quoted.
"""

from __future__ import annotations

import shlex

from calibrate.engines import shell_words
from calibrate.engines.base import Engine, EngineCommand, LaunchSpec, threads_http
from calibrate.engines.llamacpp import LLAMACPP_THREADS_HTTP
from calibrate.errors import ConfigError, UsageError

#: placeholders every custom command may use; tune may not set them (port, model) or sets the cap
BASE_PLACEHOLDERS = ("model_path", "port", "batch_size", "concurrency")


def build(spec: LaunchSpec) -> EngineCommand:
    """The command's words with every placeholder filled, ``--threads-http`` for llama-server."""
    return EngineCommand(with_threads_http(spec, custom_argv(spec)))


def with_threads_http(spec: LaunchSpec, argv: tuple[str, ...]) -> tuple[str, ...]:
    """A custom command that runs ``llama-server`` gets ``--threads-http`` unless it sets it
    itself (a user's own value is never changed, higher or lower)."""
    program = argv[0].rsplit("/", 1)[-1] if argv else ""
    threads = threads_http(spec)
    if program != "llama-server" or threads is None:
        return argv
    if any(
        word == LLAMACPP_THREADS_HTTP or word.startswith(f"{LLAMACPP_THREADS_HTTP}=")
        for word in argv
    ):
        return argv
    return (*argv, LLAMACPP_THREADS_HTTP, str(threads))


# what N to start with before anything was calibrated (afterwards server start uses the setting)
FIRST_VALUE = {
    "batch_size": " (before a ladder: the largest of [ladder] batch_sizes, so every tier fits)",
    "concurrency": " (before a sweep: the largest of [sweep] concurrency)",
}


def custom_argv(spec: LaunchSpec) -> tuple[str, ...]:
    """Split the template first, then substitute into each argument: values never re-split.

    Where an argument is itself a shell program (``bash -c '…'``), values are shell-quoted.
    """
    if not spec.command.strip():
        raise ConfigError(
            "[server] kind is custom but [server] command is empty",
            'Set it, e.g. command = "my-server --model {model_path} --port {port} --slots {concurrency}".',
        )
    try:
        words = shlex.split(spec.command)
    except ValueError as exc:
        raise ConfigError(f"[server] command cannot be split into arguments: {exc}") from exc
    values: dict[str, int | str | None] = {
        **{key: value for key, value in spec.tuned if key not in BASE_PLACEHOLDERS},
        "model_path": spec.model_path,
        "port": spec.port,
        "batch_size": spec.batch_size,
        "concurrency": spec.concurrency,
    }

    def lookup(name: str) -> str:
        value = values.get(name)
        if value in (None, "") and name not in BASE_PLACEHOLDERS:
            raise UsageError(
                f"the [server] command uses {{{name}}} but no value is known for it",
                f"Give it one: calibrate server start --set {name}=VALUE (kept for rollback, "
                f"sweep and tune), or search it: calibrate tune --grid {name}=V1,V2,…",
            )
        if value in (None, ""):  # the ladder needs this server running: never "ladder first"
            first = FIRST_VALUE.get(name, "")
            raise UsageError(
                f"the [server] command uses {{{name}}} but no value is known yet",
                f"Pass it: calibrate server start --{name.replace('_', '-')} N{first}.",
            )
        return str(value)

    return shell_words.substitute(words, lookup)


ENGINE = Engine(
    kind="custom",
    name="custom",
    cap_key="batch_size",  # any {placeholder} of the command is a tune axis
    launch=build,
    args_refused='args is not used with kind = "custom": put the flags in [server] command',
    memory_key="memory_fraction",  # where the command has that placeholder
    templated=True,
)
