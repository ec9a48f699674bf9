"""One builder per engine kind: (model path, port, batch size, concurrency) → argv + environment.

The same builders feed ``calibrate server start`` and the launch script ``pin`` writes, so the
pinned script starts exactly what calibrate would. Values go into argv elements, never through a
shell: a model path with spaces, quotes or ``$(…)`` stays one literal argument.

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

import shlex
from dataclasses import dataclass

from calibrate.engines import redaction, shell_words
from calibrate.engines.args import ServerKind, args_problem, flag_name
from calibrate.errors import ConfigError, UsageError

SERVER_KINDS: tuple[ServerKind, ...] = (
    "vllm",
    "llamacpp",
    "sglang",
    "lmdeploy",
    "ollama",
    "tgi",
    "custom",
)

# SGLang and LMDeploy serve /metrics only with this flag (off by default): without it their
# KV-cache usage (the pressure signal of an engine that reserves its memory at start, SPEC §8)
# and queue gauge are missing, and the ladder's VRAM stop rule reads a flat NVML line.
ENABLE_METRICS = "--enable-metrics"

# llama.cpp divides -c among its --parallel slots; give each slot this many tokens unless the
# verified workload says how many it needs (pin: LaunchSpec.context_tokens).
LLAMACPP_CTX_PER_SLOT = 4096

# llama.cpp serves HTTP from a small thread pool (by default --parallel + 2 threads on a small
# machine); a kept-alive idle connection holds a thread until its 5 s keep-alive timeout, so more
# clients than threads stall for 5 s (measured: 16 clients, --parallel 4: 24.9 req/s and 6.3 s
# stalls; --threads-http 20: 123 req/s). Every llama.cpp start gets this many beyond the most
# requests calibrate will have in flight (SPEC §5.8).
LLAMACPP_THREADS_HTTP = "--threads-http"
LLAMACPP_HTTP_SPARE = 2

# Engines that answer GET /health only once the model is loaded (llama.cpp: 503 while loading).
HEALTH_PATHS: dict[str, str] = {
    "vllm": "/health",
    "llamacpp": "/health",
    "sglang": "/health",
    "tgi": "/health",
}


# The engine flags tune may set, by the name used in [tune] grid / --grid (one table per kind).
# The cap (CAP_KEYS) is LaunchSpec.batch_size and is written by the builder as it always is.
TUNE_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "max_num_seqs": "--max-num-seqs",
        "max_num_batched_tokens": "--max-num-batched-tokens",
        "gpu_memory_utilization": "--gpu-memory-utilization",
        "max_model_len": "--max-model-len",
    },
    "llamacpp": {"parallel": "--parallel", "ctx_size": "-c", "batch": "-b", "ubatch": "-ub"},
    "sglang": {
        "max_running_requests": "--max-running-requests",
        "chunked_prefill_size": "--chunked-prefill-size",
        "mem_fraction_static": "--mem-fraction-static",
    },
    "lmdeploy": {
        "max_batch_size": "--max-batch-size",
        "cache_max_entry_count": "--cache-max-entry-count",
    },
    "tgi": {
        "max_concurrent_requests": "--max-concurrent-requests",
        "max_batch_total_tokens": "--max-batch-total-tokens",
    },
    "ollama": {"num_parallel": "OLLAMA_NUM_PARALLEL"},
    "custom": {},  # any {placeholder} of the command
}
#: the flag that is the engine's cap B (SPEC §5.0), per kind
CAP_KEYS: dict[str, str] = {
    "vllm": "max_num_seqs",
    "llamacpp": "parallel",
    "sglang": "max_running_requests",
    "lmdeploy": "max_batch_size",
    "tgi": "max_concurrent_requests",
    "ollama": "num_parallel",
    "custom": "batch_size",
}
#: the memory fraction found first (highest that starts and serves), where the engine has one
MEMORY_KEYS: dict[str, str] = {
    "vllm": "gpu_memory_utilization",
    "sglang": "mem_fraction_static",
    "custom": "memory_fraction",
}
#: placeholders every custom command may use; tune may not set them (port, model) or sets the cap
BASE_PLACEHOLDERS = ("model_path", "port", "batch_size", "concurrency")

Tuned = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LaunchSpec:
    """What to start: engine kind, weights, port, and the calibrated setting (None = default)."""

    kind: ServerKind
    model_path: str
    port: int
    batch_size: int | None = None
    concurrency: int | None = None
    served_name: str = ""  # the model name clients send; "" = the engine's default
    command: str = ""  # custom kind: template with {model_path} {port} {batch_size} {concurrency}
    context_tokens: int | None = None  # llama.cpp -c (all slots), sized from the verified workload
    tuned: Tuned = ()  # (TUNE_FLAGS name, value) the tune winner or a candidate sets
    args: tuple[str, ...] = ()  # [server] args: the user's own engine flags, appended verbatim

    def tuned_value(self, key: str) -> str | None:
        return next((value for name, value in self.tuned if name == key), None)

    def extra_flags(self) -> list[str]:
        """``[flag, value, …]`` for the tuned flags other than the cap and llama.cpp's -c."""
        table = TUNE_FLAGS.get(self.kind, {})
        out: list[str] = []
        for key, value in self.tuned:
            if key in (CAP_KEYS.get(self.kind), "ctx_size"):
                continue  # the cap is batch_size; -c is placed by the llama.cpp builder
            flag = table.get(key)
            if flag is None:
                known = ", ".join(table) or "none"
                raise ConfigError(
                    f"{key!r} is not a tunable {self.kind} flag (known: {known})",
                    "Fix the key in [tune] grid or --grid.",
                )
            out += [flag, value]
        return out

    def user_args(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``[server] args`` less the flags tune set for this start (their tuned value wins),
        and one note per flag so replaced."""
        table = TUNE_FLAGS.get(self.kind, {})
        tuned = {table[key]: value for key, value in self.tuned if key in table}
        kept: list[str] = []
        notes: list[str] = []
        words = iter(self.args)
        for word in words:
            name = flag_name(word)
            if name is None or name not in tuned:
                kept.append(word)
                continue
            value = word.split("=", 1)[1] if "=" in word else next(words, "")
            notes.append(f"{name} {tuned[name]} (tuned) replaces {name} {value} from [server] args")
        return tuple(kept), tuple(notes)


@dataclass(frozen=True)
class EngineCommand:
    """The engine's own command line, extra environment, and where readiness is polled."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    health_path: str | None = None  # None: poll GET /v1/models
    notes: tuple[str, ...] = ()  # a tuned flag that replaced one of [server] args, said at start

    def display(self) -> str:
        """The command as one would type it in a shell (quoted), secret values masked."""
        env = redaction.redact_env(self.env)
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env)
        return f"{prefix} {shlex.join(redaction.redact_argv(self.argv))}".strip()


def build(spec: LaunchSpec) -> EngineCommand:
    """The engine command for ``spec``; a missing model path or command is a config error."""
    if spec.kind not in SERVER_KINDS:
        raise ConfigError(
            f"unknown server kind {spec.kind!r}", f"Use one of: {', '.join(SERVER_KINDS)}."
        )
    problem = args_problem(spec.kind, spec.args)
    if problem:
        raise ConfigError(f"[server] {problem}", "Fix [server] args in calibrate.toml.")
    if spec.kind == "custom":
        return EngineCommand(_with_threads_http(spec, custom_argv(spec)))
    extra = spec.extra_flags()
    user, notes = spec.user_args()
    if spec.kind != "ollama" and not spec.model_path:
        raise ConfigError(
            f"[server] model_path is empty: a {spec.kind} server needs the model to load",
            'Set it in calibrate.toml, e.g. [server] model_path = "/models/internlm-s2".',
        )
    port, name = str(spec.port), spec.served_name
    # The engine's cap is the verified batch size B and never more (SPEC §5.0): a concurrency
    # above B queues in the server instead of raising memory past what the ladder proved.
    conc = batch = spec.batch_size
    health = HEALTH_PATHS.get(spec.kind)
    argv: list[str]
    if spec.kind == "vllm":
        argv = ["vllm", "serve", spec.model_path, "--port", port]
        argv += _flag("--served-model-name", name) + _flag("--max-num-seqs", conc) + extra
    elif spec.kind == "llamacpp":
        argv = ["llama-server", "-m", spec.model_path, "--port", port]
        argv += _flag("--alias", name) + _flag(LLAMACPP_THREADS_HTTP, threads_http(spec))
        argv += _flag("--parallel", conc)
        ctx = spec.tuned_value("ctx_size") or spec.context_tokens
        ctx = ctx or (conc * LLAMACPP_CTX_PER_SLOT if conc else None)
        argv += [
            *_flag("-c", ctx),
            *extra,
            "--metrics",
        ]  # /metrics: the queue gauges explain a knee
    elif spec.kind == "sglang":
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", spec.model_path]
        argv += ["--port", port, *_flag("--served-model-name", name)]
        argv += _flag("--max-running-requests", conc) + extra + [ENABLE_METRICS]
    elif spec.kind == "lmdeploy":
        argv = ["lmdeploy", "serve", "api_server", spec.model_path, "--server-port", port]
        argv += _flag("--model-name", name) + _flag("--max-batch-size", batch) + extra
        argv.append(ENABLE_METRICS)
    elif spec.kind == "tgi":
        argv = ["text-generation-launcher", "--model-id", spec.model_path, "--port", port]
        argv += _flag("--max-concurrent-requests", conc) + extra
    else:  # ollama: configured through its environment; models are pulled by name
        env = [("OLLAMA_HOST", f"127.0.0.1:{port}")]
        if conc:
            env.append(("OLLAMA_NUM_PARALLEL", str(conc)))
        return EngineCommand(("ollama", "serve"), tuple(env), None)
    return EngineCommand((*argv, *user), (), health, notes)


def threads_http(spec: LaunchSpec) -> int | None:
    """llama.cpp's HTTP threads for ``spec``: the most requests in flight (the concurrency, or
    the cap when that is larger) + 2; None when neither is known (the engine's default)."""
    known = [n for n in (spec.concurrency, spec.batch_size) if n]
    return max(known) + LLAMACPP_HTTP_SPARE if known else None


def _with_threads_http(spec: LaunchSpec, argv: tuple[str, ...]) -> tuple[str, ...]:
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


def _flag(name: str, value: int | str | None) -> list[str]:
    return [name, str(value)] if value not in (None, "") else []


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
        if value in (None, ""):
            raise UsageError(
                f"the [server] command uses {{{name}}} but no value is known yet",
                f"Pass it: calibrate server start --{name.replace('_', '-')} N "
                "(or calibrate a setting first: ladder, then rollback or pin).",
            )
        return str(value)

    return shell_words.substitute(words, lookup)


def health_path(kind: str | None) -> str | None:
    return HEALTH_PATHS.get(kind) if kind else None
