"""What every command shares: the flags (``cli.flags``), the output channel (``cli.output``)
and the comparison view; kept importable from here for the commands that import it so."""

from __future__ import annotations

from calibrate.cli.flags import (
    Runner,
    add_command,
    add_compare_args,
    add_force,
    add_junit,
    add_wide,
    check_junit_path,
    junit_suite,
    load_config,
    normaliser_for,
    open_stage,
    remember_secrets,
    save_junit,
)
from calibrate.cli.output import LOG_WIDTH, Output, log_width, output_for
from calibrate.cli.views.comparison import show_comparison

__all__ = [
    "LOG_WIDTH",
    "Output",
    "Runner",
    "add_command",
    "add_compare_args",
    "add_force",
    "add_junit",
    "add_wide",
    "check_junit_path",
    "junit_suite",
    "load_config",
    "log_width",
    "normaliser_for",
    "open_stage",
    "output_for",
    "remember_secrets",
    "save_junit",
    "show_comparison",
]
