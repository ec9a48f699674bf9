"""The documented maxima (README "Limits") and each section's check against them.

Every size, count and duration from the config and the flags has a bound here. A section read
from the file is checked once (``check_section``): all of its problems in one ConfigError.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.config.sections import (
    LadderConfig,
    PromptConfig,
    ServerConfig,
    SloConfig,
    SweepConfig,
    TargetConfig,
    TuneConfig,
    WorkloadConfig,
)
from calibrate.config.urls import normalise_base_url, split_endpoint
from calibrate.engines.args import args_problem, env_problem
from calibrate.errors import ConfigError, UsageError
from calibrate.workload import MAX_BATCH_SIZE, MAX_OUTPUT_TOKENS, parse_token_range

MAX_CONCURRENCY = 4096
MAX_ROUNDS = 100
MAX_TOKENS = 1_000_000
MAX_REPEATS = 100
MAX_RESTARTS = 256  # tune: at most the largest grid (MAX_CANDIDATES)
MAX_WARMUP_WAVES = 100
MAX_LIST_ITEMS = 64
MAX_TIMEOUT_S = 86_400.0
MAX_TEMPERATURE = 2.0
MAX_LATENCY_RISE = 1000.0
MAX_GAIN_MIN = 10.0
MIN_SAMPLE_INTERVAL_S, MAX_SAMPLE_INTERVAL_S = 0.001, 60.0
MAX_CONNECT_TIMEOUT_S = 3600.0
MAX_RESPONSE_MIB = 4096


@dataclass(frozen=True)
class Bound:
    """One number of a section in [low, high] ((low, high] where ``low_open``); None is unset."""

    key: str
    low: float
    high: float
    low_open: bool = False

    @property
    def span(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    @property
    def rule(self) -> str:
        return f"{self.key} must be in {self.span}"

    def admits(self, value: float) -> bool:
        return (
            math.isfinite(value) and self.low <= value <= self.high and not self.on_open_end(value)
        )

    def on_open_end(self, value: float) -> bool:
        return self.low_open and value == self.low

    def __call__(self, section: Any) -> str:
        value = getattr(section, self.key)
        return "" if value is None or self.admits(value) else f"{self.rule}, got {value!r}"


@dataclass(frozen=True)
class Steps:
    """Every value of a list within ``bound``; where ``rising``, also in order, each once."""

    bound: Bound
    label: str  # how the message names the values: "concurrency levels"
    rising: bool = False

    def __call__(self, section: Any) -> str:
        values: tuple[float, ...] = getattr(section, self.bound.key)
        low, high = self.bound.low, self.bound.high
        if any(v < low or v > high or self.bound.on_open_end(v) for v in values):
            return f"{self.label} must all be in {self.bound.span}"
        return _rising(self.bound.key, values) if self.rising else ""


def _rising(name: str, values: tuple[float, ...]) -> str:
    """Steps are climbed in order and the last passing one is the largest: ``[8, 4, 2, 2]``
    would report batch 4 although 8 passed. Refused (not silently sorted), saying what to write."""
    steps = list(values)
    if steps == sorted(set(steps)):
        return ""
    if len(steps) > 16:
        return f"{name} must rise, each value once (got {len(steps)} values out of order)"
    return f"{name} must rise, each value once: got {steps}, write {sorted(set(steps))}"


def _seed(section: PromptConfig | WorkloadConfig) -> str:
    seed = section.seed
    if seed is not None and not 0 <= seed < 2**63:
        return f"seed must be in [0, 2^63), got {seed}"
    return ""


def _target(section: TargetConfig) -> str:
    """The model named, the base URL and every one of ``base_urls`` valid, no server twice."""
    problems = []
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
    return "; ".join(problems)


def _input_tokens(section: WorkloadConfig) -> str:
    if section.input_tokens is not None:
        try:
            parse_token_range(section.input_tokens, "input_tokens")
        except UsageError as exc:
            return exc.message
    return ""


def _tasks_named(section: WorkloadConfig) -> str:
    return (
        'source = "tasks" needs tasks = "FILE"'
        if section.source == "tasks" and not section.tasks
        else ""
    )


def _engine_args(section: ServerConfig) -> str:
    return args_problem(section.kind, section.args)


def _engine_env(section: ServerConfig) -> str:
    return env_problem(section.kind, section.env)


Check = Callable[[Any], str]  # a problem text, "" when there is none
_BATCH_SIZES = Bound("batch_sizes", 1, MAX_BATCH_SIZE)
_LEVELS = Bound("concurrency", 1, MAX_CONCURRENCY)

#: what each section is checked for, in the order its problems are listed
CHECKS: dict[type[Any], tuple[Check, ...]] = {
    TargetConfig: (Bound("timeout_s", 0, MAX_TIMEOUT_S, low_open=True), _target),
    PromptConfig: (
        Bound("max_tokens", 1, MAX_TOKENS),
        Bound("temperature", 0, MAX_TEMPERATURE),
        Bound("top_p", 0, 1, low_open=True),
        _seed,
    ),
    LadderConfig: (
        Steps(_BATCH_SIZES, "batch_sizes", rising=True),
        Bound("rounds", 1, MAX_ROUNDS),
        Bound("vram_limit", 0, 1, low_open=True),
        Bound("latency_rise", 1, MAX_LATENCY_RISE),
        Bound("sample_interval_s", MIN_SAMPLE_INTERVAL_S, MAX_SAMPLE_INTERVAL_S),
        Bound("min_round_s", 0, MAX_TIMEOUT_S),
        Bound("warmup_waves", 0, MAX_WARMUP_WAVES),
        Bound("max_rounds", 0, 2 * MAX_ROUNDS),
    ),
    SweepConfig: (
        Steps(_LEVELS, "concurrency levels", rising=True),
        Bound("level_s", 0, MAX_TIMEOUT_S),
        Bound("repeats", 1, MAX_REPEATS),
        Bound("max_repeats", 1, MAX_REPEATS),
        Bound("gain_min", 0, MAX_GAIN_MIN),
    ),
    WorkloadConfig: (
        Bound("shared_prefix", 0, 1),
        _input_tokens,
        Bound("output_tokens", 1, MAX_OUTPUT_TOKENS),
        _seed,
        _tasks_named,
    ),
    TuneConfig: (
        Steps(Bound("memory_fractions", 0, 1, low_open=True), "memory_fractions"),
        Steps(_LEVELS, "concurrency levels"),
        Bound("budget_s", 0, MAX_TIMEOUT_S),
        Bound("restarts", 0, MAX_RESTARTS),
        Bound("patience", 1, MAX_RESTARTS),
        Bound("window", 0, 1, low_open=True),
    ),
    SloConfig: tuple(
        Bound(key, 0, MAX_TIMEOUT_S, low_open=True)
        for key in ("ttft_p99_s", "tpot_p99_s", "e2e_p99_s")
    ),
    ServerConfig: (
        Bound("port", 1, 65535),
        Bound("ready_timeout_s", 0, MAX_TIMEOUT_S, low_open=True),
        Bound("stop_timeout_s", 0, MAX_TIMEOUT_S, low_open=True),
        _engine_args,
        _engine_env,
    ),
}

#: the client's own settings, checked once the rest of [target] passed: the rule alone is shown
CLIENT_LIMITS = (
    Bound("connect_timeout_s", 0, MAX_CONNECT_TIMEOUT_S, low_open=True),
    Bound("max_response_mib", 0, MAX_RESPONSE_MIB, low_open=True),
)


def check_section(section: Any, name: str, path: Path) -> None:
    """Every problem of one section read from ``path``, in one ConfigError (exit 2)."""
    problems = [p for check in CHECKS.get(type(section), ()) if (p := check(section))]
    if problems:
        raise ConfigError(f"[{name}] in {path}: {'; '.join(problems)}")
    if isinstance(section, TargetConfig):
        limits = [b.rule for b in CLIENT_LIMITS if not b.admits(getattr(section, b.key))]
        if limits:
            raise ConfigError(f"[{name}] in {path}: {'; '.join(limits)}")
