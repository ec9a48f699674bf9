"""What every engine module fills in: the ``Engine`` description, the one builder that lays out
a built-in engine's command line from it, and what that takes (``LaunchSpec``) and gives back
(``EngineCommand``).

Imports nothing of calibrate but ``errors`` and its own ``redaction``: every engine module, the
registry (``calibrate.engines``), the builders and the ``[server] args`` check read it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from calibrate.engines import redaction
from calibrate.errors import ConfigError

# The engine kinds calibrate knows how to start, pin and read.
ServerKind = Literal["vllm", "llamacpp", "sglang", "lmdeploy", "ollama", "tgi", "custom"]
#: what the engine honours to force an answer's length (SPEC: the token probe)
Forcing = Literal["full", "ignore_eos", "none"]
Tuned = tuple[tuple[str, str], ...]
#: one default tune axis: its key and the values to try (deduplicated by the grid)
AxisValues = tuple[str, tuple[int | str, ...]]

# Why calibrate owns a flag, and where its value is set instead (the refusal's message).
CAP_REASON = "calibrate sets from the batch size: remove it; the ladder finds it"
PORT_REASON = "calibrate sets from [server] port: remove it and set the port there"
MODEL_REASON = "calibrate sets from [server] model_path: remove it and set the path there"
NAME_REASON = (
    "calibrate sets from [target] model (the name clients send): remove it and set it there"
)
THREADS_REASON = "calibrate sets from the most requests in flight + 2: remove it"
CTX_KEY = "ctx_size"  # the tune name of a context the slots share (llama.cpp -c)
# An engine that serves HTTP from a small thread pool (llama.cpp: --parallel + 2 threads on a
# small machine) stalls a client beyond the pool for its 5 s keep-alive timeout (measured: 16
# clients, --parallel 4: 24.9 req/s and 6.3 s stalls; --threads-http 20: 123 req/s). Every start
# gets this many threads beyond the most requests calibrate will have in flight (SPEC §5.8).
HTTP_SPARE = 2
# A batching knob's values shared by vLLM and SGLang's default tune axes.
BATCHED_TOKENS = ("2048", "4096", "8192", "16384")


def flag_name(word: str) -> str | None:
    """``--max_num_seqs=8`` → ``--max-num-seqs``; None for a word that is not a flag."""
    if not word.startswith("-") or word == "-" or word[1:2].isdigit():
        return None  # a value: "-", "-1", "-0.5"
    name = word.split("=", 1)[0]
    dashes = len(name) - len(name.lstrip("-"))
    return name[:dashes] + name[dashes:].replace("_", "-")


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
    tuned: Tuned = ()  # (tune flag name, value) the tune winner or a candidate sets
    args: tuple[str, ...] = ()  # [server] args: the user's own engine flags, appended verbatim
    env: tuple[tuple[str, str], ...] = ()  # [server] env: the engine's environment, every start

    def tuned_value(self, key: str) -> str | None:
        return next((value for name, value in self.tuned if name == key), None)


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


@dataclass(frozen=True)
class CapReport:
    """Where a running server says its own cap: GET ``path``, the JSON key ``key``."""

    path: str
    key: str
    source: str  # how the ladder names it: "llama.cpp /props total_slots"
    # when the answer holds no number there: how to make the cap known (never read as no cap)
    unset: str = ""


@dataclass(frozen=True)
class BatchInvariance:
    """How an engine is switched to batch-invariant kernels: an environment variable set to a
    true value (``env``), or a flag on its command line (``flag``) — SPEC §13."""

    env: str = ""  # "VLLM_BATCH_INVARIANT": on when set to anything but "", "0", "false"
    flag: str = ""  # "--enable-deterministic-inference"

    @property
    def switch(self) -> str:
        """How a user turns it on, as they would type it."""
        return f"{self.env}=1" if self.env else self.flag


@dataclass(frozen=True)
class EngineMetrics:
    """The engine's Prometheus names: KV-cache usage (a fraction), requests waiting, requests
    running (its own count: below B while others wait, it is the server's cap, SPEC §6.1), why
    they wait (vLLM's by-reason gauge), and the counter of requests it preempted because its KV
    cache was full."""

    kv: tuple[str, ...] = ()
    queue: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    waiting_by_reason: tuple[str, ...] = ()  # a gauge with a reason label: capacity | deferred


@dataclass(frozen=True)
class PrefixCacheInfo:
    """The engine's prefix cache (SPEC §13): its name, where it says what it found — counters
    of prompt tokens found (``hits``) and looked up (``queries``) in ``/metrics``, or a field of
    each answer (``per_answer``) — the info gauge whose ``state_label`` says on or off, and how
    a user switches it on."""

    name: str
    hits: tuple[str, ...] = ()
    queries: tuple[str, ...] = ()
    state: str = ""
    state_label: str = ""
    per_answer: str = ""
    switch: str = ""


def _no_axes(batch: int) -> tuple[AxisValues, ...]:
    return ()


@dataclass(frozen=True)
class Engine:
    """Everything calibrate knows about one engine kind, in one place.

    A built-in engine's command line is data: ``program``, the model (after ``model_flag``, or
    alone), ``port_flag`` PORT, the served name, the HTTP threads, the cap (its tune flag), the
    context, the tuned flags, ``trailing``, then ``[server] args`` (``command``). A kind that is
    not one such line (Ollama's environment, a user's template) brings its own ``launch``.
    """

    kind: ServerKind
    name: str  # as its users write it: "vLLM", "llama.cpp"
    cap_key: str  # the tune flag that is the engine's cap B (SPEC §5.0)
    tune_flags: Mapping[str, str] = field(default_factory=dict)  # tune name → engine flag
    program: tuple[str, ...] = ()  # the words before the model: ("vllm", "serve")
    model_flag: str = ""  # the flag before the model path ("": the path stands alone)
    port_flag: str = "--port"
    name_flag: str = ""  # the flag of the model name clients send ("": the engine has none)
    trailing: tuple[str, ...] = ()  # after the tuned flags: "--enable-metrics"
    refused: Mapping[str, str] = field(default_factory=dict)  # other spellings of its flags → why
    launch: Callable[[LaunchSpec], EngineCommand] | None = None  # builds its own command instead
    args_refused: str = ""  # why [server] args cannot be used at all ("" when they can)
    default_axes: Callable[[int], tuple[AxisValues, ...]] = _no_axes  # around the ladder's B
    memory_key: str | None = None  # the memory fraction tune finds first, where there is one
    health_path: str | None = None  # answers only once the model is loaded; None: /v1/models
    needs_model_path: bool = True  # False: the engine pulls its models by name (Ollama)
    forcing: Forcing = "full"
    preallocates: bool = False  # reserves its KV cache at start: NVML reads flat under load
    metrics: EngineMetrics = EngineMetrics()
    metrics_hint: str = ""  # how to turn its KV-cache gauge on, where it may be off
    cap_report: CapReport | None = None
    context_hint: str = ""  # what to raise when an answer runs into the context limit
    http_threads_flag: str | None = None  # sized for the requests in flight (llama.cpp)
    ctx_per_slot: int | None = None  # context shared by the slots: tokens per slot by default
    ctx_spellings: tuple[str, ...] = ()  # that context's flag as a user may write it in args
    restarts_per_tier: bool = False  # the ladder restarts it at each tier's batch size
    templated: bool = False  # a user's command: tune axes are its {placeholders}, no cap flag
    batch_invariance: BatchInvariance | None = None  # its deterministic mode, where it has one
    prefix_cache: PrefixCacheInfo | None = None  # None: it has none calibrate can read
    env_set: tuple[str, ...] = ()  # the variables its own launch sets (Ollama's host and cap)
    # its answers' system_fingerprint, where it says more than the build: a pattern whose
    # "build" and "config" groups split it (vLLM: vllm-<version>-<hash of the engine config>)
    fingerprint: str = ""

    def build(self, spec: LaunchSpec) -> EngineCommand:
        """The argv (and environment) for one start of ``spec``: the engine's own variables
        (Ollama's host and cap), then ``[server] env`` (which may not set those)."""
        built = self.launch(spec) if self.launch is not None else command(spec, self)
        if not spec.env:
            return built
        return EngineCommand(built.argv, (*built.env, *spec.env), built.health_path, built.notes)

    @property
    def own_flags(self) -> dict[str, str]:
        """The flags the shared builder writes, by every spelling, → why ``[server] args`` may
        not set them (none for a kind with its own ``launch``)."""
        if not self.program:
            return {}
        written = [
            (self.tune_flags[self.cap_key], CAP_REASON),
            (self.port_flag, PORT_REASON),
            (self.model_flag, MODEL_REASON),
            (self.name_flag, NAME_REASON),
            (self.http_threads_flag, THREADS_REASON),
        ]
        return {**{name: why for name, why in written if name}, **self.refused}


def around(batch: int) -> tuple[int, ...]:
    """The cap's default tune values: B/2, B and 2B."""
    return (max(1, batch // 2), batch, 2 * batch)


def flag(name: str | None, value: int | str | None) -> list[str]:
    """``[name, value]``, or nothing when the engine has no such flag or the value is not known
    (the engine's default)."""
    return [name, str(value)] if name and value not in (None, "") else []


def http_threads(batch: int | None, concurrency: int | None) -> int | None:
    """The HTTP threads for cap ``batch`` and ``concurrency`` in flight (see ``threads_http``)."""
    known = [n for n in (concurrency, batch) if n]
    return max(known) + HTTP_SPARE if known else None


def threads_http(spec: LaunchSpec) -> int | None:
    """The HTTP threads for ``spec``: the most requests in flight (the concurrency, or the cap
    when that is larger) + 2; None when neither is known (the engine's default)."""
    return http_threads(spec.batch_size, spec.concurrency)


def command(spec: LaunchSpec, engine: Engine) -> EngineCommand:
    """The built-in engines' one builder, laid out by ``engine``'s data; a model path missing
    where the engine needs one, or a tuned key it does not take, is a config error."""
    extra = tuned_flags(spec, engine)
    user, notes = _user_args(spec, engine)
    if engine.needs_model_path and not spec.model_path:
        raise ConfigError(
            f"[server] model_path is empty: a {spec.kind} server needs the model to load",
            'Set it in calibrate.toml, e.g. [server] model_path = "/models/internlm-s2".',
        )
    slots = spec.batch_size
    argv = [*engine.program, *([engine.model_flag] if engine.model_flag else []), spec.model_path]
    argv += [engine.port_flag, str(spec.port), *flag(engine.name_flag, spec.served_name)]
    argv += flag(engine.http_threads_flag, threads_http(spec))
    argv += flag(engine.tune_flags[engine.cap_key], slots)
    if engine.ctx_per_slot:  # -c covers every slot: sized from them unless tune, pin or you said
        ctx = spec.tuned_value(CTX_KEY) or spec.context_tokens
        ctx = ctx or (slots * engine.ctx_per_slot if slots else None)
        if spec.tuned_value(CTX_KEY) or stated_context(user, engine) is None:
            argv += flag(engine.tune_flags[CTX_KEY], ctx)
    argv += [*extra, *engine.trailing, *user]
    return EngineCommand(tuple(argv), (), engine.health_path, notes)


def tuned_flags(spec: LaunchSpec, engine: Engine) -> list[str]:
    """``[flag, value, …]`` for the tuned flags other than the cap and the context."""
    table = engine.tune_flags
    out: list[str] = []
    for key, value in spec.tuned:
        if key in (engine.cap_key, CTX_KEY):
            continue  # the cap is batch_size; the context is sized by the builder
        found = table.get(key)
        if found is None:
            known = ", ".join(table) or "none"
            raise ConfigError(
                f"{key!r} is not a tunable {spec.kind} flag (known: {known})",
                "Fix the key in [tune] grid or --grid.",
            )
        out += [found, value]
    return out


def _user_args(spec: LaunchSpec, engine: Engine) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``[server] args`` less the flags tune set for this start (their tuned value wins), and
    one note per flag so replaced."""
    table = engine.tune_flags
    tuned = {table[key]: value for key, value in spec.tuned if key in table}
    kept: list[str] = []
    notes: list[str] = []
    words = iter(spec.args)
    for word in words:
        name = flag_name(word)
        if name in engine.ctx_spellings:  # -c or --ctx-size: the one flag tune's ctx_size sets
            name = table[CTX_KEY]
        if name is None or name not in tuned:
            kept.append(word)
            continue
        value = word.split("=", 1)[1] if "=" in word else next(words, "")
        notes.append(f"{name} {tuned[name]} (tuned) replaces {name} {value} from [server] args")
    return tuple(kept), tuple(notes)


def stated_context(args: Sequence[str], engine: Engine) -> int | None:
    """The shared context a user gave in ``[server] args`` (llama.cpp ``-c 8192`` or
    ``--ctx-size=8192``): calibrate then sizes none of its own. None: not given, or not a
    positive whole number (the engine will say what is wrong with it)."""
    words = list(args)
    for n, word in enumerate(words):
        name = flag_name(word)
        if name is None or name not in engine.ctx_spellings:
            continue
        value = (
            word.split("=", 1)[1] if "=" in word else (words[n + 1] if n + 1 < len(words) else "")
        )
        return int(value) if value.isdigit() and int(value) > 0 else None
    return None
