"""What the determinism copies found, said on the command line (SPEC §13)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calibrate.cli.common import Output
from calibrate.config import Config
from calibrate.stages.measure.determinism import DeterminismCheck, overall
from calibrate.stages.measure.determinism_wave import managed_switch


def say_differs(out: Output, check: DeterminismCheck | None, where: str) -> None:
    """One line for a tier or level whose copies did not all agree (nothing when they did)."""
    if check is not None and check.divergence is not None:
        out.warn(check.describe(where))


def say_overall(
    out: Output, cfg: Config, checks: Sequence[tuple[str, DeterminismCheck]]
) -> dict[str, Any] | None:
    """The run's determinism line and, when copies differed on a known engine, its
    batch-invariant switch; the same for ``--json`` (None when no copies were sent)."""
    line = overall(checks)
    if line is None:
        return None
    differed = any(c.divergence is not None for _, c in checks)
    (out.warn if differed else out.say)(line)
    switch = managed_switch(cfg)
    if differed and switch is not None:
        out.say(switch.advice())
    return {
        "copies": max(c.copies for _, c in checks),
        "deterministic": not differed,
        "switch": switch.to_json() if switch is not None else None,
    }
