"""Configuration: built-in defaults < calibrate.toml < environment < flags, resolved once.

This is the only module that reads ``os.environ`` (it is handed in as a mapping, so tests
pass their own). The API key is kept in memory only and is masked whenever shown.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from calibrate.engines.args import ServerKind, args_problem
from calibrate.errors import ConfigError, UsageError
from calibrate.redact import redact_url
from calibrate.workload import (
    MAX_OUTPUT_TOKENS,
    Pick,
    WorkloadFlags,
    WorkloadSource,
    parse_token_range,
)

LadderMode = Literal["wave", "prompt-list"]
TuneSearch = Literal["grid", "halving"]

DEFAULT_CONFIG_NAME = "calibrate.toml"
MAX_CONNECT_TIMEOUT_S = 3600.0
MAX_RESPONSE_MIB = 4096


@dataclass(frozen=True)
class TargetConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "internlm-s2"
    api_key_env: str = "CALIBRATE_API_KEY"
    timeout_s: float = 600.0  # the whole request: connect, send and every read, streams too
    connect_timeout_s: float = 10.0
    max_response_mib: float = 64.0  # a larger answer is invalid_response, never buffered whole
    gpu_metrics_key_env: str = ""  # names the variable holding a key for --gpu-metrics-url
    # batch across several servers: "URL" or "URL#c=N"; the first is the target's base_url
    base_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class PromptConfig:
    text: str = "用一句话说明什么是定长数组。"
    temperature: float = 0.0
    max_tokens: int = 128
    top_p: float = 1.0
    seed: int | None = 0


@dataclass(frozen=True)
class LadderConfig:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    rounds: int = 2
    mode: LadderMode = "wave"
    vram_limit: float = 0.90
    latency_rise: float = 1.25  # per_item_s (wall / items) over the previous tier's
    sample_interval_s: float = 0.05
    min_round_s: float = 2.0  # a round repeats waves of B until it lasted this long (0: one wave)
    warmup_waves: int = 1  # waves of the first tier sent before it, not counted


@dataclass(frozen=True)
class SweepConfig:
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    level_s: float = 15.0  # each run of a level lasts at least this (and ≥ 4×C requests)
    repeats: int = 3  # runs per level: the table shows their median and range
    gain_min: float = 0.10
    max_repeats: int = 6  # runs of a level whose range overlaps the best's while the medians differ


@dataclass(frozen=True)
class WorkloadConfig:
    """[workload] (SPEC §5.11): what ladder and sweep send; flags override each key."""

    source: WorkloadSource | None = None  # None: tasks or synthetic when given, else fixed
    tasks: str = ""
    pick: Pick | None = None  # None: longest for the ladder, sample for the sweep
    input_tokens: int | str | None = None  # 2000, or "512:4096" for a uniform range
    output_tokens: int | None = None
    shared_prefix: float = 0.0
    seed: int = 0

    def flags(self) -> WorkloadFlags:
        return WorkloadFlags(
            source=self.source,
            tasks=self.tasks or None,
            pick=self.pick,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            shared_prefix=self.shared_prefix,
            seed=self.seed,
        )


@dataclass(frozen=True)
class TuneConfig:
    """``calibrate tune`` (SPEC §5.12): the engine flags to search and how."""

    grid: tuple[str, ...] = ()  # "KEY=V1,V2,…" per axis; replaces the kind's default axis KEY
    memory_fractions: tuple[float, ...] = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7)  # tried high → low
    search: TuneSearch = "grid"
    budget_s: float = 0.0  # 0 = no cap on the whole run
    concurrency: tuple[int, ...] = ()  # levels per candidate; () = [sweep] concurrency
    window: float = 1.0  # each level's window as a fraction of the sweep's


@dataclass(frozen=True)
class SloConfig:
    """Latency bounds at p99 (SPEC §5.13); each off (None) unless set."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p99_s: float | None = None

    @property
    def needs_stream(self) -> bool:
        """TTFT (and TPOT, computed from it) is only measured on a streamed answer."""
        return self.ttft_p99_s is not None or self.tpot_p99_s is not None


@dataclass(frozen=True)
class ConfidenceConfig:
    """[confidence] (SPEC §13): the level of the t-intervals repeats are reported with."""

    level: float = 0.95

    def __post_init__(self) -> None:  # a ValueError here is the file's ConfigError (exit 2)
        if not 0.5 < self.level < 1:
            raise ValueError(
                f"[confidence] level must be in (0.5, 1), e.g. 0.95 for 95 %, got {self.level!r}"
            )


@dataclass(frozen=True)
class DeterminismConfig:
    """[determinism] (SPEC §13): copies of the fixed prompt per ladder tier and sweep level.

    Off (0) by default: each tier and level then sends no extra requests, so its run time and
    the load the server sees are the measurement's alone; ``single --determinism N`` asks once.
    """

    copies: int = 0

    def __post_init__(self) -> None:  # a ValueError here is the file's ConfigError (exit 2)
        if self.copies != 0 and not 8 <= self.copies <= 1024:
            raise ValueError(
                f"[determinism] copies must be 0 (off) or 8–1024 (fewer say little about a "
                f"batch), got {self.copies!r}"
            )


@dataclass(frozen=True)
class CostConfig:
    """[cost] (SPEC §13): what the server's GPUs cost per hour, all of them together."""

    gpu_price_per_hour: float | None = None  # None: no $ per 1M output tokens

    def __post_init__(self) -> None:  # a ValueError here is the file's ConfigError (exit 2)
        price = self.gpu_price_per_hour
        if price is not None and not (math.isfinite(price) and price >= 0):
            raise ValueError(
                f"[cost] gpu_price_per_hour must be a finite number ≥ 0, e.g. 2.5, got {price!r}"
            )


@dataclass(frozen=True)
class ServerConfig:
    kind: ServerKind | None = None
    model_path: str = ""
    port: int = 8000
    command: str = ""
    # the engine's own flags (--tensor-parallel-size 2), appended verbatim to every managed start
    args: tuple[str, ...] = ()
    ready_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0


@dataclass(frozen=True)
class PathsConfig:
    runs: str = "runs"
    baselines: str = "baselines"
    scripts: str = "scripts"


@dataclass(frozen=True)
class Config:
    target: TargetConfig = field(default_factory=TargetConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    ladder: LadderConfig = field(default_factory=LadderConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    determinism: DeterminismConfig = field(default_factory=DeterminismConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    source: str | None = None
    api_key: str | None = field(default=None, repr=False)
    gpu_metrics_key: str | None = field(default=None, repr=False)

    @property
    def runs_dir(self) -> Path:
        return Path(self.paths.runs)

    @property
    def baselines_dir(self) -> Path:
        return Path(self.paths.baselines)

    @property
    def scripts_dir(self) -> Path:
        return Path(self.paths.scripts)

    def to_public_json(self) -> dict[str, Any]:
        """The resolved values for manifests and ``status --show-config``; the key masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("api_key", "gpu_metrics_key", "source"):
                continue
            out[f.name] = dataclasses.asdict(getattr(self, f.name))
        out["target"]["base_url"] = redact_url(self.target.base_url)
        out["target"]["base_urls"] = [redact_url(url) for url in self.target.base_urls]
        out["source"] = self.source
        out["api_key"] = mask_secret(self.api_key)
        out["gpu_metrics_key"] = mask_secret(self.gpu_metrics_key)
        return out


SECTIONS: dict[str, type[Any]] = {
    "target": TargetConfig,
    "prompt": PromptConfig,
    "ladder": LadderConfig,
    "sweep": SweepConfig,
    "workload": WorkloadConfig,
    "tune": TuneConfig,
    "slo": SloConfig,
    "confidence": ConfidenceConfig,
    "determinism": DeterminismConfig,
    "cost": CostConfig,
    "server": ServerConfig,
    "paths": PathsConfig,
}


#: keys earlier versions accepted, with what to do instead
REMOVED_KEYS: dict[tuple[str, str], str] = {
    ("ladder", "concurrency"): (
        "The ladder sends one batch at a time; requests in flight are the sweep's axis. "
        "Delete the line, and set [sweep] concurrency = [...] for the levels to try."
    ),
    ("sweep", "items"): (
        "A level now runs for a time, not a count: at least [sweep] level_s seconds and 4×C "
        "requests, [sweep] repeats times. Delete the line (set level_s for shorter levels)."
    ),
}


def mask_secret(secret: str | None) -> str | None:
    if not secret:
        return None
    if len(secret) <= 8:
        return "****"
    return f"{secret[:3]}…{secret[-2:]}"


@dataclass(frozen=True)
class Overrides:
    """Command-line flags that override the config (None = not given)."""

    config_path: str | None = None
    base_url: str | None = None
    model: str | None = None


def load(overrides: Overrides, environ: Mapping[str, str]) -> Config:
    """Resolve the configuration once: defaults < file < environment < flags."""
    path_text = overrides.config_path or environ.get("CALIBRATE_CONFIG")
    explicit = path_text is not None
    path = Path(path_text) if path_text else Path(DEFAULT_CONFIG_NAME)
    cfg = Config()
    if path.exists() or explicit:
        cfg = _apply_file(cfg, path)
    target = cfg.target
    if environ.get("CALIBRATE_BASE_URL"):
        target = replace(target, base_url=environ["CALIBRATE_BASE_URL"])
    if environ.get("CALIBRATE_MODEL"):
        target = replace(target, model=environ["CALIBRATE_MODEL"])
    if overrides.base_url:
        target = replace(target, base_url=overrides.base_url)
    if overrides.model:
        target = replace(target, model=overrides.model)
    if environ.get("CALIBRATE_BASE_URL") or overrides.base_url:
        target = replace(target, base_urls=())  # one URL given: it replaces the list too
    elif target.base_urls:
        target = replace(target, base_url=split_endpoint(target.base_urls[0])[0])
    target = replace(target, base_url=normalise_base_url(target.base_url))
    key_var = next(
        (v for v in (target.api_key_env, "CALIBRATE_API_KEY", "OPENAI_API_KEY") if environ.get(v)),
        None,
    )
    api_key = _checked_key(environ, key_var)
    metrics_key = _checked_key(environ, target.gpu_metrics_key_env or None)
    return replace(cfg, target=target, api_key=api_key, gpu_metrics_key=metrics_key)


def _checked_key(environ: Mapping[str, str], var: str | None) -> str | None:
    """The key in ``var``, surrounding whitespace stripped (a CRLF .env); never printed."""
    key = (environ.get(var) or "").strip() if var else ""
    if not key:
        return None
    bad = next((i for i, ch in enumerate(key) if not " " <= ch <= "~"), None)
    if bad is not None:
        raise ConfigError(
            f"the key in ${var} has a control or non-ASCII character at position {bad + 1}",
            f"Set {var} again to the key alone (no quotes, line breaks or invisible characters).",
        )
    return key


def normalise_base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1/`` both become ``…/v1``.

    Whatever it came from (file, environment, ``--base-url``), a URL without a host, with a
    port outside 1–65535, or with a query string or fragment is a config error (exit 2).
    """
    url = url.strip().rstrip("/")
    where = "(--base-url, CALIBRATE_BASE_URL or [target].base_url)"
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"base_url {_shown_url(url)!r} is not an http(s) URL",
            "Give one like http://127.0.0.1:8000/v1 (--base-url or [target].base_url).",
        )
    bad_host = ConfigError(
        f"base_url {_shown_url(url)!r} has no valid host (an IPv6 address goes in brackets, "
        f"as in http://[::1]:8000/v1) {where}"
    )
    try:
        parts = urlsplit(url)  # "http://[::1/v1": ValueError (Invalid IPv6 URL)
        hostname = parts.hostname  # "[zz]": ValueError (not an IP address)
    except ValueError:
        raise bad_host from None
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"base_url {_shown_url(url)!r}: the port must be in 1–65535 {where}")
    if not hostname:
        raise ConfigError(f"base_url {_shown_url(url)!r} has no host {where}")
    try:
        parse_url(url)  # what the client will send to: "[::1]x:80" passes urlsplit, not this
    except LocationParseError:
        raise bad_host from None
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ConfigError(
            f"base_url {_shown_url(url)!r} has a query string or fragment {where}",
            "Give the server's root or its /v1, e.g. http://127.0.0.1:8000/v1.",
        )
    if not url.endswith("/v1"):
        url += "/v1"
    return url


MAX_ENDPOINT_CONCURRENCY = 4096


def split_endpoint(text: str) -> tuple[str, int | None]:
    """``"http://h:8000/v1#c=8"`` → (normalised URL, 8); without ``#c=N`` the concurrency is None."""
    url, sep, suffix = text.strip().partition("#")
    concurrency: int | None = None
    if sep:
        value = suffix.removeprefix("c=")
        if not suffix.startswith("c=") or not value.isdigit():
            raise ConfigError(
                f"endpoint {_shown_url(text)!r}: after '#' only c=N (its concurrency) is allowed",
                "Write it like http://10.0.0.2:8000/v1#c=8.",
            )
        concurrency = int(value)
        if not 1 <= concurrency <= MAX_ENDPOINT_CONCURRENCY:
            raise ConfigError(
                f"endpoint {_shown_url(text)!r}: c must be in "
                f"[1, {MAX_ENDPOINT_CONCURRENCY}], got {concurrency}"
            )
    return normalise_base_url(url), concurrency


def _shown_url(url: str) -> str:
    """The URL for a message: credentials before the host never printed."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, tail = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}{sep}{netloc}{slash}{tail}"


CONFIG_MAX_BYTES = 1 << 20  # a calibrate.toml is a few KiB; a bigger file is a wrong --config


def _apply_file(cfg: Config, path: Path) -> Config:
    try:
        with path.open("rb") as fh:
            raw = fh.read(CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"cannot read config {path}: {exc.strerror or exc}",
            "Check the path given by --config or CALIBRATE_CONFIG, or run: calibrate init",
        ) from exc
    if len(raw) > CONFIG_MAX_BYTES:
        raise ConfigError(
            f"{path} is over {CONFIG_MAX_BYTES >> 20} MiB: not a calibrate config",
            "Check the path given by --config or CALIBRATE_CONFIG (a task file goes to --tasks or "
            "--input), or run: calibrate init",
        )
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path} is not valid TOML: {exc}", "Fix the file and run again."
        ) from exc
    except RecursionError:  # a = [[[[…: the parser recurses once per level
        raise ConfigError(
            f"{path} is not valid TOML: arrays or tables nested too deeply to read",
            "Fix the file and run again.",
        ) from None
    sections: dict[str, Any] = {}
    for name, value in data.items():
        section_type = SECTIONS.get(name)
        if section_type is None:
            raise ConfigError(
                f"unknown section [{name}] in {path}",
                f"Known sections: {', '.join(SECTIONS)}.",
            )
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {name} must be a [{name}] table")
        sections[name] = _build_section(section_type, getattr(cfg, name), value, name, path)
    return replace(cfg, source=str(path), **sections)


def _build_section(
    section_type: type[Any], current: Any, values: dict[str, Any], name: str, path: Path
) -> Any:
    hints = get_type_hints(section_type)
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if (name, key) in REMOVED_KEYS:
            raise ConfigError(
                f"{name}.{key} in {path} is no longer a setting", REMOVED_KEYS[name, key]
            )
        if key not in hints:
            known = ", ".join(hints)
            raise ConfigError(
                f"unknown key {name}.{key} in {path}",
                f"Known keys in [{name}]: {known}.",
            )
        changes[key] = _coerce(hints[key], value, f"{name}.{key}", path)
    try:
        built = replace(current, **changes)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    _check_ranges(built, name, path)
    _check_client_limits(built, name, path)
    return built


def _coerce(hint: Any, value: Any, where: str, path: Path) -> Any:
    origin = get_origin(hint)
    args = get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        for option in inner[:-1]:  # int | str: the first type the value is
            try:
                return _coerce(option, value, where, path)
            except ConfigError:
                continue
        return _coerce(inner[-1], value, where, path)
    if origin is Literal:
        if value not in args:
            choices = " | ".join(str(a) for a in args)
            raise ConfigError(f"{where} in {path} is {value!r}; expected one of: {choices}")
        return value
    if origin is tuple:
        if where == "server.args" and not isinstance(value, list):
            raise ConfigError(
                f"{where} in {path} must be a list of strings, one argument each, "
                f'e.g. args = ["--tensor-parallel-size", "2"]; got {value!r}'
            )
        if not isinstance(value, list) or (not value and where != "server.args"):
            raise ConfigError(f"{where} in {path} must be a non-empty list, got {value!r}")
        if len(value) > MAX_LIST_ITEMS:
            raise ConfigError(
                f"{where} in {path} has {len(value)} entries; at most {MAX_LIST_ITEMS} are allowed"
            )
        return tuple(_coerce(args[0], v, where, path) for v in value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} in {path} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where} in {path} must be a finite number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} in {path} must be an integer, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} in {path} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{where} in {path}: unsupported value {value!r}")


# Documented maxima (README "Limits"): every size, count and duration from config and flags.
MAX_BATCH_SIZE = 4096
MAX_CONCURRENCY = 4096
MAX_ROUNDS = 100
MAX_TOKENS = 1_000_000
MAX_REPEATS = 100
MAX_WARMUP_WAVES = 100
MAX_LIST_ITEMS = 64
MAX_TIMEOUT_S = 86_400.0
MAX_TEMPERATURE = 2.0
MAX_LATENCY_RISE = 1000.0
MAX_GAIN_MIN = 10.0
MIN_SAMPLE_INTERVAL_S, MAX_SAMPLE_INTERVAL_S = 0.001, 60.0


def _rising(name: str, values: tuple[int, ...]) -> str:
    """Steps are climbed in order and the last passing one is the largest: ``[8, 4, 2, 2]``
    would report batch 4 although 8 passed. Refused (not silently sorted), saying what to write."""
    steps = list(values)
    if steps == sorted(set(steps)):
        return ""
    if len(steps) > 16:
        return f"{name} must rise, each value once (got {len(steps)} values out of order)"
    return f"{name} must rise, each value once: got {steps}, write {sorted(set(steps))}"


def _between(name: str, value: float, low: float, high: float, *, low_open: bool = False) -> str:
    """A problem text when ``value`` is NaN/inf or outside [low, high] ((low, high] if open)."""
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        return f"{name} must be in {bracket}{low:g}, {high:g}], got {value!r}"
    return ""


def _check_client_limits(section: Any, name: str, path: Path) -> None:
    """Bounds of the client's own settings: the connect timeout and the answer-size cap."""
    if not isinstance(section, TargetConfig):
        return
    problems: list[str] = []
    if not 0 < section.connect_timeout_s <= MAX_CONNECT_TIMEOUT_S:
        problems.append(f"connect_timeout_s must be in (0, {MAX_CONNECT_TIMEOUT_S:g}]")
    if not 0 < section.max_response_mib <= MAX_RESPONSE_MIB:
        problems.append(f"max_response_mib must be in (0, {MAX_RESPONSE_MIB}]")
    if problems:
        raise ConfigError(f"[{name}] in {path}: {'; '.join(problems)}")


def _check_ranges(section: Any, name: str, path: Path) -> None:
    problems: list[str] = []
    if isinstance(section, TargetConfig):
        problems.append(_between("timeout_s", section.timeout_s, 0, MAX_TIMEOUT_S, low_open=True))
        if not section.model.strip():
            problems.append("model must name the model the server registered (it is empty)")
        try:
            normalise_base_url(section.base_url)
            urls = [split_endpoint(text)[0] for text in section.base_urls]
        except ConfigError as exc:
            problems.append(exc.message)
        else:
            if len(set(urls)) != len(urls):
                problems.append("base_urls lists the same server twice")
    if isinstance(section, PromptConfig):
        problems.append(_between("max_tokens", section.max_tokens, 1, MAX_TOKENS))
        problems.append(_between("temperature", section.temperature, 0, MAX_TEMPERATURE))
        problems.append(_between("top_p", section.top_p, 0, 1, low_open=True))
        if section.seed is not None and not 0 <= section.seed < 2**63:
            problems.append(f"seed must be in [0, 2^63), got {section.seed}")
    if isinstance(section, LadderConfig):
        if any(not 1 <= b <= MAX_BATCH_SIZE for b in section.batch_sizes):
            problems.append(f"batch_sizes must all be in [1, {MAX_BATCH_SIZE}]")
        else:
            problems.append(_rising("batch_sizes", section.batch_sizes))
        problems.append(_between("rounds", section.rounds, 1, MAX_ROUNDS))
        problems.append(_between("vram_limit", section.vram_limit, 0, 1, low_open=True))
        problems.append(_between("latency_rise", section.latency_rise, 1, MAX_LATENCY_RISE))
        problems.append(
            _between(
                "sample_interval_s",
                section.sample_interval_s,
                MIN_SAMPLE_INTERVAL_S,
                MAX_SAMPLE_INTERVAL_S,
            )
        )
        problems.append(_between("min_round_s", section.min_round_s, 0, MAX_TIMEOUT_S))
        problems.append(_between("warmup_waves", section.warmup_waves, 0, MAX_WARMUP_WAVES))
    if isinstance(section, SweepConfig):
        if any(not 1 <= c <= MAX_CONCURRENCY for c in section.concurrency):
            problems.append(f"concurrency levels must all be in [1, {MAX_CONCURRENCY}]")
        else:
            problems.append(_rising("concurrency", section.concurrency))
        problems.append(_between("level_s", section.level_s, 0, MAX_TIMEOUT_S))
        problems.append(_between("repeats", section.repeats, 1, MAX_REPEATS))
        problems.append(_between("max_repeats", section.max_repeats, 1, MAX_REPEATS))
        problems.append(_between("gain_min", section.gain_min, 0, MAX_GAIN_MIN))
    if isinstance(section, WorkloadConfig):
        problems += _workload_problems(section)
    if isinstance(section, TuneConfig):
        if any(not 0 < f <= 1 for f in section.memory_fractions):
            problems.append("memory_fractions must all be in (0, 1]")
        if any(not 1 <= c <= MAX_CONCURRENCY for c in section.concurrency):
            problems.append(f"concurrency levels must all be in [1, {MAX_CONCURRENCY}]")
        problems.append(_between("budget_s", section.budget_s, 0, MAX_TIMEOUT_S))
        problems.append(_between("window", section.window, 0, 1, low_open=True))
    if isinstance(section, SloConfig):
        for key in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s"):
            value = getattr(section, key)
            if value is not None:
                problems.append(_between(key, value, 0, MAX_TIMEOUT_S, low_open=True))
    if isinstance(section, ServerConfig):
        problems.append(_between("port", section.port, 1, 65535))
        problems.append(
            _between("ready_timeout_s", section.ready_timeout_s, 0, MAX_TIMEOUT_S, low_open=True)
        )
        problems.append(
            _between("stop_timeout_s", section.stop_timeout_s, 0, MAX_TIMEOUT_S, low_open=True)
        )
        problems.append(args_problem(section.kind, section.args))
    problems = [p for p in problems if p]
    if problems:
        raise ConfigError(f"[{name}] in {path}: {'; '.join(problems)}")


def _workload_problems(section: WorkloadConfig) -> list[str]:
    problems = [_between("shared_prefix", section.shared_prefix, 0, 1)]
    if section.input_tokens is not None:
        try:
            parse_token_range(section.input_tokens, "input_tokens")
        except UsageError as exc:
            problems.append(exc.message)
    if section.output_tokens is not None:
        problems.append(_between("output_tokens", section.output_tokens, 1, MAX_OUTPUT_TOKENS))
    if not 0 <= section.seed < 2**63:
        problems.append(f"seed must be in [0, 2^63), got {section.seed}")
    if section.source == "tasks" and not section.tasks:
        problems.append('source = "tasks" needs tasks = "FILE"')
    return problems
