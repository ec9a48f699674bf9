"""Configuration: built-in defaults < calibrate.toml < environment < flags, resolved once.

This is the only module that reads ``os.environ`` (it is handed in as a mapping, so tests
pass their own). The API key is kept in memory only and is masked whenever shown.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from calibrate.errors import ConfigError

LadderMode = Literal["wave", "prompt-list"]
ServerKind = Literal["vllm", "llamacpp", "sglang", "lmdeploy", "ollama", "tgi", "custom"]

DEFAULT_CONFIG_NAME = "calibrate.toml"


@dataclass(frozen=True)
class TargetConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "internlm-s2"
    api_key_env: str = "CALIBRATE_API_KEY"
    timeout_s: float = 600.0


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
    latency_rise: float = 1.5
    sample_interval_s: float = 0.05


@dataclass(frozen=True)
class SweepConfig:
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    items: int = 24
    gain_min: float = 0.10


@dataclass(frozen=True)
class ServerConfig:
    kind: ServerKind | None = None
    model_path: str = ""
    port: int = 8000
    command: str = ""
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
    server: ServerConfig = field(default_factory=ServerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    source: str | None = None
    api_key: str | None = field(default=None, repr=False)

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
            if f.name in ("api_key", "source"):
                continue
            out[f.name] = dataclasses.asdict(getattr(self, f.name))
        out["source"] = self.source
        out["api_key"] = mask_secret(self.api_key)
        return out


SECTIONS: dict[str, type[Any]] = {
    "target": TargetConfig,
    "prompt": PromptConfig,
    "ladder": LadderConfig,
    "sweep": SweepConfig,
    "server": ServerConfig,
    "paths": PathsConfig,
}


#: keys earlier versions accepted, with what to do instead
REMOVED_KEYS: dict[tuple[str, str], str] = {
    ("ladder", "concurrency"): (
        "The ladder sends one batch at a time; requests in flight are the sweep's axis. "
        "Delete the line, and set [sweep] concurrency = [...] for the levels to try."
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
    target = replace(target, base_url=normalise_base_url(target.base_url))
    api_key = (
        environ.get(target.api_key_env)
        or environ.get("CALIBRATE_API_KEY")
        or environ.get("OPENAI_API_KEY")
        or None
    )
    return replace(cfg, target=target, api_key=api_key)


def normalise_base_url(url: str) -> str:
    """``http://host:8000`` and ``http://host:8000/v1/`` both become ``…/v1``."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"base_url {url!r} is not an http(s) URL",
            "Give one like http://127.0.0.1:8000/v1 (--base-url or [target].base_url).",
        )
    if not url.endswith("/v1"):
        url += "/v1"
    return url


def _apply_file(cfg: Config, path: Path) -> Config:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read config {path}: {exc.strerror or exc}",
            "Check the path given by --config or CALIBRATE_CONFIG, or run: calibrate init",
        ) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path} is not valid TOML: {exc}", "Fix the file and run again."
        ) from exc
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
    return built


def _coerce(hint: Any, value: Any, where: str, path: Path) -> Any:
    origin = get_origin(hint)
    args = get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where, path)
    if origin is Literal:
        if value not in args:
            choices = " | ".join(str(a) for a in args)
            raise ConfigError(f"{where} in {path} is {value!r}; expected one of: {choices}")
        return value
    if origin is tuple:
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{where} in {path} must be a non-empty list, got {value!r}")
        return tuple(_coerce(args[0], v, where, path) for v in value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} in {path} must be a number, got {value!r}")
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


def _check_ranges(section: Any, name: str, path: Path) -> None:
    problems: list[str] = []
    if isinstance(section, TargetConfig) and section.timeout_s <= 0:
        problems.append("timeout_s must be > 0")
    if isinstance(section, PromptConfig) and section.max_tokens < 1:
        problems.append("max_tokens must be ≥ 1")
    if isinstance(section, LadderConfig):
        if any(b < 1 for b in section.batch_sizes):
            problems.append("batch_sizes must all be ≥ 1")
        if section.rounds < 1:
            problems.append("rounds must be ≥ 1")
        if not 0 < section.vram_limit <= 1:
            problems.append("vram_limit must be a fraction in (0, 1]")
        if section.sample_interval_s <= 0:
            problems.append("sample_interval_s must be > 0")
    if isinstance(section, SweepConfig) and (
        any(c < 1 for c in section.concurrency) or section.items < 1
    ):
        problems.append("concurrency levels and items must be ≥ 1")
    if problems:
        raise ConfigError(f"[{name}] in {path}: {'; '.join(problems)}")
