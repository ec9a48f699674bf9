"""calibrate.toml read into the sections: unknown or removed keys refused, each value typed.

A value is coerced to its field's annotation (a list to a tuple, an int to a float, a Literal
checked); a section once built is checked against its bounds (limits.py).
"""

from __future__ import annotations

import math
import shlex
import tomllib
import types
import typing
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from calibrate.config.limits import MAX_LIST_ITEMS, check_section
from calibrate.config.sections import SECTIONS, Config
from calibrate.errors import ConfigError

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


_FROM_ENV = (
    "The API key is read from the environment only, never from this file: delete the line "
    "and export CALIBRATE_API_KEY (or name another variable with [target] api_key_env)."
)
#: a secret written into the file: where it goes instead (the value is never shown)
SECRET_KEYS = {("target", k): _FROM_ENV for k in ("api_key", "key", "openai_api_key", "token")}

CONFIG_MAX_BYTES = 1 << 20  # a calibrate.toml is a few KiB; a bigger file is a wrong --config
UTF8_BOM = b"\xef\xbb\xbf"  # what Windows Notepad puts first; read past, as in a tasks file


def apply_file(cfg: Config, path: Path) -> Config:
    """``cfg`` with every section ``path`` sets replaced, each checked; ``source`` is the path."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(
            f"cannot read config {path}: {exc.strerror or exc}",
            "Check the path given by --config or CALIBRATE_CONFIG, or write a starter file "
            f"there: calibrate init {shlex.quote(str(path))}",
        ) from exc
    if len(raw) > CONFIG_MAX_BYTES:
        raise ConfigError(
            f"{path} is over {CONFIG_MAX_BYTES >> 20} MiB: not a calibrate config",
            "Check the path given by --config or CALIBRATE_CONFIG (a task file goes to --tasks or "
            "--input), or run: calibrate init",
        )
    try:
        data = tomllib.loads(raw.removeprefix(UTF8_BOM).decode("utf-8"))
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
    """``current`` with the table's keys, each coerced to its field's type, then checked."""
    hints = get_type_hints(section_type)
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if (name, key) in REMOVED_KEYS:
            raise ConfigError(
                f"{name}.{key} in {path} is no longer a setting", REMOVED_KEYS[name, key]
            )
        if key not in hints:
            known = f"Known keys in [{name}]: {', '.join(hints)}."
            raise ConfigError(
                f"unknown key {name}.{key} in {path}", SECRET_KEYS.get((name, key), known)
            )
        changes[key] = _coerce(hints[key], value, f"{name}.{key}", path)
    try:
        built = replace(current, **changes)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    check_section(built, name, path)
    return built


def _env_table(value: Any, where: str, path: Path) -> tuple[tuple[str, str], ...]:
    """``[server] env`` as (name, value) pairs: a table of strings (a number is written as
    TOML gave it, ``VLLM_CPU_KVCACHE_SPACE = 4``)."""
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where} in {path} must be a table of variables, "
            f'e.g. env = {{ VLLM_CPU_KVCACHE_SPACE = "4" }}; got {value!r}'
        )
    pairs: list[tuple[str, str]] = []
    for name, item in value.items():
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise ConfigError(
                f"{where}.{name} in {path} must be a string (or a number), got {item!r}"
            )
        pairs.append((str(name), item if isinstance(item, str) else str(item)))
    return tuple(pairs)


def _coerce(hint: Any, value: Any, where: str, path: Path) -> Any:
    """A TOML value as the field typed ``hint`` holds it, or a ConfigError naming ``where``."""
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
    if where == "server.env":
        return _env_table(value, where, path)
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
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        raise ConfigError(  # TOML integers have any size; nothing calibrate counts is this big
            f"{where} in {path} is out of range ({len(str(abs(value)))} digits); "
            "give a number below 2^63"
        )
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
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} in {path} must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} in {path} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{where} in {path}: unsupported value {value!r}")
