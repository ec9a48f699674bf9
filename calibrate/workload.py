"""What ladder and sweep send (SPEC §5.11): the workload's spec, resolved once from config and flags.

``fixed`` (the default) repeats the fixed prompt; ``tasks`` takes items of a batch input file
(``--pick longest`` — the worst case for memory — or a seeded ``sample``); ``synthetic`` builds
seeded prompts of ``--input-tokens`` (one size or a uniform ``A:B`` range) with answers forced to
``--output-tokens``. Every bound is checked here (exit 2 naming the flag and its maximum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from calibrate.errors import UsageError

WorkloadSource = Literal["fixed", "tasks", "synthetic"]
Pick = Literal["longest", "sample"]
Axis = Literal["batch", "context"]
PICKS: tuple[Pick, ...] = ("longest", "sample")

# Documented maxima (README "Limits").
MAX_INPUT_TOKENS = 1_048_576
MAX_OUTPUT_TOKENS = 1_000_000
MAX_CONTEXT_STEPS = 32
MAX_BATCH_SIZE = 4096


@dataclass(frozen=True)
class TokenRange:
    """Input tokens per request: one size (low == high) or a uniform range."""

    low: int
    high: int

    @property
    def mean(self) -> int:
        return (self.low + self.high) // 2

    def describe(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


def parse_token_range(text: str | int, where: str) -> TokenRange:
    """``2000`` or ``"512:4096"`` → a range; anything else (or out of bounds) is exit 2."""
    raw = str(text).strip()
    low_text, sep, high_text = raw.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        raise UsageError(
            f"{where} must be a token count N or a range A:B, got {text!r}",
            "e.g. --input-tokens 2000, or --input-tokens 512:4096 for a uniform range",
        ) from None
    if not 1 <= low <= high <= MAX_INPUT_TOKENS:
        raise UsageError(
            f"{where} must be in [1, {MAX_INPUT_TOKENS}] (and A ≤ B for a range), got {raw}"
        )
    return TokenRange(low, high)


@dataclass(frozen=True)
class WorkloadSpec:
    """The resolved workload: which source, and its sizes. ``prompt`` prefixes task items."""

    source: WorkloadSource = "fixed"
    tasks: Path | None = None
    pick: Pick = "longest"
    input_tokens: TokenRange | None = None
    output_tokens: int | None = None
    shared_prefix: float = 0.0
    seed: int = 0
    prompt: str = ""

    @property
    def fixed(self) -> bool:
        return self.source == "fixed"

    def describe(self) -> str:
        if self.source == "fixed":
            return "the fixed prompt"
        if self.source == "tasks":
            text = f"tasks {self.tasks} (pick {self.pick})"
        else:
            assert self.input_tokens is not None
            text = f"synthetic {self.input_tokens.describe()} input tokens"
            if self.shared_prefix:
                text += f" ({self.shared_prefix:.0%} shared prefix)"
        if self.output_tokens:
            text += f", answers forced to {self.output_tokens} tokens"
        return text


@dataclass(frozen=True)
class WorkloadFlags:
    """The command line's workload flags (None = not given) and the [workload] section's values."""

    source: WorkloadSource | None = None
    tasks: str | None = None
    pick: Pick | None = None
    input_tokens: str | int | None = None
    output_tokens: int | None = None
    shared_prefix: float | None = None
    seed: int | None = None
    prompt: str | None = None


@dataclass(frozen=True)
class AxisFlags:
    """The ladder's ``--axis``, ``--context-lengths`` and ``--batch`` (None = not given)."""

    axis: Axis = "batch"
    context_lengths: str | None = None
    batch: int | None = None


@dataclass(frozen=True)
class ResolvedWorkload:
    """What a command sends, resolved once from config and flags: the workload, and for the
    ladder the axis it steps (the context axis: its lengths, None for the default ones)."""

    spec: WorkloadSpec
    axis: Axis = "batch"
    context_lengths: tuple[int, ...] | None = None
    context_batch: int = 1


def resolve_workload_flags(
    file: WorkloadFlags,
    flags: WorkloadFlags,
    along: AxisFlags = AxisFlags(),
    *,
    default_pick: Pick,
    max_tokens: int,
) -> ResolvedWorkload:
    """Flags over [workload]; a synthetic workload forces answers to ``max_tokens`` ([prompt])
    unless --output-tokens says otherwise. Exit 2 on anything out of bounds."""
    if along.axis == "context":
        return _context_axis(file, flags, along, max_tokens)
    for flag, value in (("--context-lengths", along.context_lengths), ("--batch", along.batch)):
        if value is not None:
            raise UsageError(f"{flag} goes with --axis context")
    spec = resolve_workload(file, flags, default_pick=default_pick)
    if spec.source == "synthetic" and spec.output_tokens is None:
        spec = replace(spec, output_tokens=max_tokens)
    return ResolvedWorkload(spec)


def _context_axis(
    file: WorkloadFlags, flags: WorkloadFlags, along: AxisFlags, max_tokens: int
) -> ResolvedWorkload:
    """The context axis sends synthetic inputs of its own lengths (sized per step)."""
    if flags.tasks or flags.input_tokens is not None:
        raise UsageError(
            "--axis context steps synthetic inputs of its own lengths: drop --tasks/--input-tokens",
            "Give the lengths with --context-lengths 512,1024,… (default: up to max_model_len).",
        )
    if along.batch is not None and not 1 <= along.batch <= MAX_BATCH_SIZE:
        raise UsageError(f"--batch must be in [1, {MAX_BATCH_SIZE}], got {along.batch}")
    lengths = along.context_lengths
    steps = parse_context_lengths(lengths) if lengths is not None else None
    spec = resolve_workload(
        WorkloadFlags(seed=file.seed),
        WorkloadFlags(
            input_tokens=1,
            output_tokens=flags.output_tokens or max_tokens,
            shared_prefix=flags.shared_prefix,
        ),
    )
    return ResolvedWorkload(spec, "context", steps, along.batch or 1)


def resolve_workload(
    file: WorkloadFlags, flags: WorkloadFlags, *, default_pick: Pick = "longest"
) -> WorkloadSpec:
    """Flags over the [workload] section; the source follows what was given when not named."""
    tasks = flags.tasks if flags.tasks is not None else file.tasks
    input_tokens = flags.input_tokens if flags.input_tokens is not None else file.input_tokens
    if flags.tasks is not None and flags.input_tokens is not None:
        raise UsageError("--tasks and --input-tokens are two workloads: give one of them")
    source = flags.source
    if source is None and flags.tasks is not None:
        source = "tasks"
    elif source is None and flags.input_tokens is not None:
        source = "synthetic"
    source = (
        source or file.source or ("tasks" if tasks else "synthetic" if input_tokens else "fixed")
    )
    output = flags.output_tokens if flags.output_tokens is not None else file.output_tokens
    shared = flags.shared_prefix if flags.shared_prefix is not None else file.shared_prefix
    seed = flags.seed if flags.seed is not None else file.seed
    pick = flags.pick or file.pick or default_pick
    _check_output(output)
    if shared is not None and not (math.isfinite(shared) and 0.0 <= shared <= 1.0):
        raise UsageError(f"--shared-prefix must be a fraction in [0, 1], got {shared}")
    if seed is not None and not 0 <= seed < 2**63:
        raise UsageError(f"[workload] seed must be in [0, 2^63), got {seed}")
    spec = WorkloadSpec(
        source,
        pick=pick,
        shared_prefix=shared or 0.0,
        seed=seed or 0,
        prompt=flags.prompt or "",
        output_tokens=output,
    )
    if source == "tasks":
        if not tasks:
            raise UsageError("the tasks workload needs a file: --tasks FILE ([workload] tasks)")
        return replace(spec, tasks=Path(tasks))
    if source == "synthetic":
        if input_tokens is None:
            raise UsageError(
                "the synthetic workload needs --input-tokens N (or A:B)",
                "e.g. --input-tokens 2000 --output-tokens 200",
            )
        return replace(spec, input_tokens=parse_token_range(input_tokens, "--input-tokens"))
    if output is not None or shared:
        raise UsageError(
            "--output-tokens and --shared-prefix shape a synthetic or tasks workload",
            "Add --input-tokens N (synthetic prompts) or --tasks FILE.",
        )
    return spec


def _check_output(output: int | None) -> None:
    if output is not None and not 1 <= output <= MAX_OUTPUT_TOKENS:
        raise UsageError(f"--output-tokens must be in [1, {MAX_OUTPUT_TOKENS}], got {output}")


def parse_context_lengths(text: str) -> tuple[int, ...]:
    """``--context-lengths 512,1024,2048`` → increasing input lengths (exit 2 otherwise)."""
    try:
        lengths = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(
            f"--context-lengths must be comma-separated token counts, got {text!r}",
            "e.g. --context-lengths 512,1024,2048,4096",
        ) from None
    if not lengths or len(lengths) > MAX_CONTEXT_STEPS:
        raise UsageError(f"--context-lengths takes 1 to {MAX_CONTEXT_STEPS} lengths")
    if any(not 1 <= n <= MAX_INPUT_TOKENS for n in lengths):
        raise UsageError(f"--context-lengths must all be in [1, {MAX_INPUT_TOKENS}]")
    if list(lengths) != sorted(set(lengths)):
        raise UsageError("--context-lengths must increase, e.g. 512,1024,2048")
    return lengths
