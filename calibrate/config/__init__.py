"""Configuration: built-in defaults < calibrate.toml < environment < flags, resolved once.

sections (the frozen dataclasses and their defaults), file (calibrate.toml read and typed),
limits (the documented maxima, each section's check), urls (base URLs), text (argv and the
environment read as UTF-8), load (the precedence), starter (the file `calibrate init` writes). The names other packages use are handed on here.
"""

from calibrate.config.limits import MAX_RESTARTS, MAX_ROUNDS, MAX_TIMEOUT_S
from calibrate.config.load import DEFAULT_CONFIG_NAME, Overrides, config_path, load
from calibrate.config.sections import (
    Config,
    LadderConfig,
    LadderMode,
    SloConfig,
    SweepConfig,
    TuneSearch,
)
from calibrate.config.starter import STARTER_TOML
from calibrate.config.urls import normal_url, normalise_base_url, split_endpoint
from calibrate.workload import MAX_BATCH_SIZE

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "MAX_BATCH_SIZE",
    "MAX_RESTARTS",
    "MAX_ROUNDS",
    "MAX_TIMEOUT_S",
    "STARTER_TOML",
    "Config",
    "LadderConfig",
    "LadderMode",
    "Overrides",
    "SloConfig",
    "SweepConfig",
    "TuneSearch",
    "config_path",
    "load",
    "normal_url",
    "normalise_base_url",
    "split_endpoint",
]
