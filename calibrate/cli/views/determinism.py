"""What the determinism copies found, said on the command line (SPEC §13)."""

from __future__ import annotations

from calibrate.cli.output import Output
from calibrate.stages.determinism import Determinism, DeterminismCheck


def say_differs(out: Output, check: DeterminismCheck | None, where: str) -> None:
    """One line for a tier or level whose copies did not all agree, or did not all answer
    (nothing when every copy answered alike)."""
    if check is not None and check.deterministic is not True:
        out.warn(check.describe(where))


def say_overall(out: Output, found: Determinism | None) -> None:
    """The run's determinism line and, when copies differed on a known engine, its
    batch-invariant switch (nothing when no copies were sent)."""
    if found is None:
        return
    (out.say if found.deterministic else out.warn)(found.line)
    if found.differed and found.switch is not None:
        out.say(found.switch.advice())
