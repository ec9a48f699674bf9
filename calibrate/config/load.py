"""The configuration resolved once: built-in defaults < calibrate.toml < environment < flags.

This is the only place that reads the environment (it is handed in as a mapping, so tests pass
their own). The API key is kept in memory only and is masked whenever shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from calibrate.config.file import apply_file
from calibrate.config.proxy import proxy_note
from calibrate.config.sections import Config
from calibrate.config.urls import normalise_base_url, split_endpoint
from calibrate.errors import ConfigError
from calibrate.io.os_text import as_utf8

DEFAULT_CONFIG_NAME = "calibrate.toml"


@dataclass(frozen=True)
class Overrides:
    """Command-line flags that override the config (None = not given)."""

    config_path: str | None = None
    base_url: str | None = None
    model: str | None = None


def config_path(overrides: Overrides, environ: Mapping[str, str]) -> tuple[Path, bool]:
    """The file a command reads (--config, else $CALIBRATE_CONFIG, else calibrate.toml), and
    whether it was named (a named file must exist; calibrate.toml may be absent)."""
    path_text = overrides.config_path or environ.get("CALIBRATE_CONFIG")
    return Path(path_text or DEFAULT_CONFIG_NAME), path_text is not None


def load(overrides: Overrides, environ: Mapping[str, str]) -> Config:
    """Resolve the configuration once: defaults < file < environment < flags."""
    path, explicit = config_path(overrides, environ)
    cfg = Config()
    if path.exists() or explicit:
        cfg = apply_file(cfg, path)
    target = cfg.target
    if environ.get("CALIBRATE_BASE_URL"):
        url = as_utf8(environ["CALIBRATE_BASE_URL"], "$CALIBRATE_BASE_URL")
        target = replace(target, base_url=url)
    if environ.get("CALIBRATE_MODEL"):
        target = replace(target, model=as_utf8(environ["CALIBRATE_MODEL"], "$CALIBRATE_MODEL"))
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
    return replace(
        cfg,
        target=target,
        api_key=api_key,
        gpu_metrics_key=metrics_key,
        cache_dir=cache_dir(environ),
        proxy_note=proxy_note(target.base_url, environ),
    )


def cache_dir(environ: Mapping[str, str]) -> str:
    """The cache calibrate names: ``$XDG_CACHE_HOME/calibrate``, else ``~/.cache/calibrate`` —
    only under a folder that exists (a missing HOME is never created); "" when there is none."""
    xdg = environ.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute() and Path(xdg).is_dir():
        return str(Path(xdg) / "calibrate")
    home = environ.get("HOME", "")
    if home and Path(home).is_absolute() and Path(home).is_dir():
        return str(Path(home) / ".cache" / "calibrate")
    return ""


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
